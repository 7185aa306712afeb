// require-digest, in AssemblyScript: the same admission policy as
// examples/policies/require-digest, to show that the ABI (docs/wasm-abi.md)
// does not depend on the guest's language. It denies a service whose bundle
// or image is not named by its digest.

const ABI_MAJOR: i32 = 1;
const ABI_MINOR: i32 = 1;

// ---- ABI exports (docs/wasm-abi.md section 2) ----

export function berth_abi_version(): i32 {
  return (ABI_MAJOR << 16) | ABI_MINOR;
}

export function allocate(size: i32): i32 {
  return <i32>heap.alloc(size > 0 ? <usize>size : 1);
}

export function deallocate(ptr: i32, size: i32): void {
  heap.free(<usize>ptr);
}

export function berth_metadata(): i64 {
  return answer('{"kind":"policy","abi_major":1,"abi_minor":1,"name":"require-digest-as","version":"1.0.0"}');
}

export function policy_evaluate(ptr: i32, len: i32): i64 {
  const text = String.UTF8.decodeUnsafe(<usize>ptr, <usize>len);
  const p = new Parser(text);
  const input = p.value();
  if (p.failed || input == null || input.kind != OBJ) {
    return answer('{"error":{"code":"bad_input","message":"policy input is not a JSON object"}}');
  }
  const hook = input.str("hook");
  let svc: Value | null = null;
  if (hook == "service.apply") {
    const a = serviceApplyInput(input);
    if (a != null) svc = a.service;
  } else if (hook == "deploy") {
    const d = deployInput(input);
    if (d != null) svc = d.service;
  } else if (hook == "service.delete" || hook == "node.enroll") {
    return answer('{"decision":"allow"}');
  } else {
    return answer('{"error":{"code":"unsupported","message":"unknown hook ' + escape(hook) + '"}}');
  }
  if (svc == null) {
    return answer('{"error":{"code":"bad_input","message":"the input of hook ' + escape(hook) + ' carries no service"}}');
  }
  const reasons = new Array<string>();
  const bundle = svc.str("bundle");
  if (bundle.length > 0 && !bundle.startsWith("sha256:")) {
    reasons.push("bundle " + bundle + " is not named by digest; use sha256:<hex>");
  }
  const image = svc.str("image");
  if (image.length > 0 && !image.includes("@sha256:")) {
    reasons.push("image " + image + " is not pinned by digest; use name@sha256:<hex>");
  }
  if (reasons.length == 0) return answer('{"decision":"allow"}');
  let out = '{"decision":"deny","reasons":[';
  for (let i = 0; i < reasons.length; i++) {
    if (i > 0) out += ",";
    out += '"' + escape(reasons[i]) + '"';
  }
  return answer(out + "]}");
}

// ---- typed helpers for every hook (docs/wasm-abi.md section 5.1), as sdk/wasm has for Go ----
// Each returns null when the input is of another hook or lacks the objects
// its hook always carries.

// ServiceApply is a service.apply input: the service as it would be stored,
// and the stored one (null for a new service).
class ServiceApply {
  service: Value;
  old: Value | null;
  constructor(service: Value, old: Value | null) {
    this.service = service;
    this.old = old;
  }
}

// Placement is a deploy input: the service, the slot about to start and the
// chosen node.
class Placement {
  service: Value;
  slot: i32;
  node: Value;
  constructor(service: Value, slot: i32, node: Value) {
    this.service = service;
    this.slot = slot;
    this.node = node;
  }
}

function objectAt(v: Value | null, key: string): Value | null {
  if (v == null) return null;
  const o = v.get(key);
  if (o == null || o.kind != OBJ) return null;
  return o;
}

function serviceApplyInput(input: Value): ServiceApply | null {
  if (input.str("hook") != "service.apply") return null;
  const svc = objectAt(input, "object");
  if (svc == null) return null;
  return new ServiceApply(svc, objectAt(input, "old_object"));
}

// serviceDeleteInput returns the stored service about to be deleted.
function serviceDeleteInput(input: Value): Value | null {
  if (input.str("hook") != "service.delete") return null;
  return objectAt(input, "old_object");
}

// nodeEnrollInput returns the enrolling node.
function nodeEnrollInput(input: Value): Value | null {
  if (input.str("hook") != "node.enroll") return null;
  return objectAt(input, "object");
}

function deployInput(input: Value): Placement | null {
  if (input.str("hook") != "deploy") return null;
  const p = objectAt(input, "object");
  const svc = objectAt(p, "service");
  const node = objectAt(p, "node");
  if (p == null || svc == null || node == null) return null;
  const slot = p.get("slot");
  if (slot == null || slot.kind != SCALAR) return null;
  return new Placement(svc, <i32>parseInt(slot.text, 10), node);
}

// answer copies s as UTF-8 into memory the host gives back with deallocate,
// and packs its pointer and length.
function answer(s: string): i64 {
  const buf = String.UTF8.encode(s);
  const n = buf.byteLength;
  const ptr = heap.alloc(n > 0 ? <usize>n : 1);
  memory.copy(ptr, changetype<usize>(buf), <usize>n);
  return (<i64>ptr << 32) | <i64>n;
}

function escape(s: string): string {
  let out = "";
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c == 0x22) out += '\\"';
    else if (c == 0x5c) out += "\\\\";
    else if (c < 0x20) out += "\\u00" + (c < 0x10 ? "0" : "") + c.toString(16);
    else out += String.fromCharCode(c);
  }
  return out;
}

// ---- a small JSON reader: enough for objects, arrays, strings and scalars ----

const NUL: i32 = 0;
const STR: i32 = 1;
const OBJ: i32 = 2;
const ARR: i32 = 3;
const SCALAR: i32 = 4;

class Value {
  kind: i32 = NUL;
  text: string = "";
  keys: Array<string> = new Array<string>();
  items: Array<Value> = new Array<Value>();

  get(key: string): Value | null {
    for (let i = 0; i < this.keys.length; i++) {
      if (this.keys[i] == key) return this.items[i];
    }
    return null;
  }

  // str returns the string under key, or "" when absent or not a string.
  str(key: string): string {
    const v = this.get(key);
    if (v == null || v.kind != STR) return "";
    return v.text;
  }
}

class Parser {
  s: string;
  i: i32 = 0;
  failed: bool = false;
  depth: i32 = 0;

  constructor(s: string) {
    this.s = s;
  }

  fail(): Value | null {
    this.failed = true;
    return null;
  }

  ws(): void {
    while (this.i < this.s.length) {
      const c = this.s.charCodeAt(this.i);
      if (c != 0x20 && c != 0x0a && c != 0x0d && c != 0x09) break;
      this.i++;
    }
  }

  value(): Value | null {
    this.ws();
    if (this.failed || this.i >= this.s.length || this.depth > 64) return this.fail();
    const c = this.s.charCodeAt(this.i);
    if (c == 0x7b) return this.object();
    if (c == 0x5b) return this.array();
    if (c == 0x22) {
      const v = new Value();
      v.kind = STR;
      const t = this.string();
      if (t == null) return this.fail();
      v.text = t;
      return v;
    }
    const start = this.i;
    while (this.i < this.s.length) {
      const d = this.s.charCodeAt(this.i);
      if (d == 0x2c || d == 0x7d || d == 0x5d || d == 0x20 || d == 0x0a || d == 0x0d || d == 0x09) break;
      this.i++;
    }
    if (this.i == start) return this.fail();
    const v = new Value();
    const word = this.s.substring(start, this.i);
    v.kind = word == "null" ? NUL : SCALAR;
    v.text = word;
    return v;
  }

  string(): string | null {
    this.i++; // opening quote
    let out = "";
    let start = this.i;
    while (this.i < this.s.length) {
      const c = this.s.charCodeAt(this.i);
      if (c == 0x22) {
        out += this.s.substring(start, this.i);
        this.i++;
        return out;
      }
      if (c == 0x5c) {
        out += this.s.substring(start, this.i);
        this.i++;
        if (this.i >= this.s.length) return null;
        const e = this.s.charCodeAt(this.i);
        if (e == 0x6e) out += "\n";
        else if (e == 0x74) out += "\t";
        else if (e == 0x72) out += "\r";
        else if (e == 0x62) out += "\b";
        else if (e == 0x66) out += "\f";
        else if (e == 0x75) {
          if (this.i + 4 >= this.s.length) return null;
          out += String.fromCharCode(<i32>parseInt(this.s.substring(this.i + 1, this.i + 5), 16));
          this.i += 4;
        } else out += String.fromCharCode(e);
        this.i++;
        start = this.i;
        continue;
      }
      this.i++;
    }
    return null;
  }

  object(): Value | null {
    this.i++;
    this.depth++;
    const v = new Value();
    v.kind = OBJ;
    this.ws();
    if (this.i < this.s.length && this.s.charCodeAt(this.i) == 0x7d) {
      this.i++;
      this.depth--;
      return v;
    }
    while (true) {
      this.ws();
      if (this.i >= this.s.length || this.s.charCodeAt(this.i) != 0x22) return this.fail();
      const k = this.string();
      if (k == null) return this.fail();
      this.ws();
      if (this.i >= this.s.length || this.s.charCodeAt(this.i) != 0x3a) return this.fail();
      this.i++;
      const item = this.value();
      if (item == null) return this.fail();
      v.keys.push(k);
      v.items.push(item);
      this.ws();
      if (this.i >= this.s.length) return this.fail();
      const c = this.s.charCodeAt(this.i);
      this.i++;
      if (c == 0x7d) break;
      if (c != 0x2c) return this.fail();
    }
    this.depth--;
    return v;
  }

  array(): Value | null {
    this.i++;
    this.depth++;
    const v = new Value();
    v.kind = ARR;
    this.ws();
    if (this.i < this.s.length && this.s.charCodeAt(this.i) == 0x5d) {
      this.i++;
      this.depth--;
      return v;
    }
    while (true) {
      const item = this.value();
      if (item == null) return this.fail();
      v.items.push(item);
      this.ws();
      if (this.i >= this.s.length) return this.fail();
      const c = this.s.charCodeAt(this.i);
      this.i++;
      if (c == 0x5d) break;
      if (c != 0x2c) return this.fail();
    }
    this.depth--;
    return v;
  }
}
