// require-digest, in AssemblyScript: the same admission policy as
// examples/policies/require-digest, to show that the ABI (docs/wasm-abi.md)
// does not depend on the guest's language. It denies a service whose bundle
// or image is not named by its digest.
//
// It is written the way a guest without a garbage collector is fast: built
// with the stub runtime (a bump allocator, no collector), it reads the input
// bytes where the host wrote them, checks that they are one JSON object and
// keeps only where the few values it needs lie; nothing is decoded into
// strings or trees, and the answer is written straight into the buffer the
// host reads. Every allocation of a call is given back at once when the host
// has deallocated everything it was handed (see deallocate).

const ABI_MAJOR: i32 = 1;
const ABI_MINOR: i32 = 1;

// ---- ABI exports (docs/wasm-abi.md section 2) ----

export function berth_abi_version(): i32 {
  return (ABI_MAJOR << 16) | ABI_MINOR;
}

// live counts the buffers handed to the host (inputs it filled, answers it
// reads) that it has not yet given back.
let live: i32 = 0;

export function allocate(size: i32): i32 {
  live++;
  return <i32>heap.alloc(size > 0 ? <usize>size : 1);
}

// deallocate gives a buffer back. Once the host holds none, nothing of the
// last call is reachable any more, and the whole heap is reset in one step.
export function deallocate(ptr: i32, size: i32): void {
  live--;
  if (live <= 0) {
    live = 0;
    heap.reset();
  }
}

export function berth_metadata(): i64 {
  const o = new Out(128);
  o.lit('{"kind":"policy","abi_major":1,"abi_minor":1,"name":"require-digest-as","version":"1.0.0"}');
  return o.answer();
}

export function policy_evaluate(ptr: i32, len: i32): i64 {
  const s = new Scan(<usize>ptr, <usize>len);
  if (!s.input()) {
    const o = new Out(96);
    o.lit('{"error":{"code":"bad_input","message":"policy input is not a JSON object"}}');
    return o.answer();
  }
  let bundle: Span | null = null;
  let image: Span | null = null;
  if (s.hook.is("service.apply")) {
    if (!s.objIsObject) return noService(s.hook);
    bundle = s.bundle;
    image = s.image;
  } else if (s.hook.is("deploy")) {
    if (!s.objIsObject || !s.svcIsObject || !s.nodeIsObject || !s.slotIsScalar) return noService(s.hook);
    bundle = s.svcBundle;
    image = s.svcImage;
  } else if (s.hook.is("service.delete") || s.hook.is("node.enroll")) {
    const o = new Out(32);
    o.lit('{"decision":"allow"}');
    return o.answer();
  } else {
    const o = new Out(96 + s.hook.len);
    o.lit('{"error":{"code":"unsupported","message":"unknown hook ');
    o.raw(s.hook);
    o.lit('"}}');
    return o.answer();
  }
  const badBundle = bundle.len > 0 && !bundle.startsWith("sha256:");
  const badImage = image.len > 0 && !image.contains("@sha256:");
  if (!badBundle && !badImage) {
    const o = new Out(32);
    o.lit('{"decision":"allow"}');
    return o.answer();
  }
  const o = new Out(160 + bundle.len + image.len);
  o.lit('{"decision":"deny","reasons":[');
  if (badBundle) {
    o.lit('"bundle ');
    o.raw(bundle);
    o.lit(' is not named by digest; use sha256:<hex>"');
  }
  if (badImage) {
    if (badBundle) o.lit(",");
    o.lit('"image ');
    o.raw(image);
    o.lit(' is not pinned by digest; use name@sha256:<hex>"');
  }
  o.lit("]}");
  return o.answer();
}

function noService(hook: Span): i64 {
  const o = new Out(96 + hook.len);
  o.lit('{"error":{"code":"bad_input","message":"the input of hook ');
  o.raw(hook);
  o.lit(' carries no service"}}');
  return o.answer();
}

// ---- the answer: bytes written in place, packed for the host ----

class Out {
  ptr: usize;
  n: usize = 0;
  cap: usize;

  constructor(cap: usize) {
    live++; // the host deallocates the answer
    this.cap = cap;
    this.ptr = heap.alloc(cap);
  }

  // lit appends an ASCII literal.
  lit(s: string): void {
    const n = <usize>s.length;
    for (let i: usize = 0; i < n; i++) store<u8>(this.ptr + this.n + i, <u8>s.charCodeAt(<i32>i));
    this.n += n;
  }

  // raw appends a JSON string's content as it stood in the input: it was
  // checked to be valid string content, so it needs no escaping again.
  raw(s: Span): void {
    memory.copy(this.ptr + this.n, s.ptr, s.len);
    this.n += s.len;
  }

  answer(): i64 {
    return (<i64>this.ptr << 32) | <i64>this.n;
  }
}

// ---- where a string value lies in the input ----

class Span {
  ptr: usize = 0; // its content, between the quotes, as written
  len: usize = 0;
  escaped: bool = false; // contains a backslash: compare decoded

  set(ptr: usize, len: usize, escaped: bool): void {
    this.ptr = ptr;
    this.len = len;
    this.escaped = escaped;
  }

  clear(): void {
    this.len = 0;
    this.escaped = false;
  }

  // text returns the decoded bytes as a pointer and length (a copy only
  // when the content has escapes).
  decoded(): Span {
    if (!this.escaped) return this;
    const d = new Span();
    d.ptr = heap.alloc(this.len > 0 ? this.len : 1);
    d.len = unescape(this.ptr, this.len, d.ptr);
    return d;
  }

  is(lit: string): bool {
    const d = this.decoded();
    if (d.len != <usize>lit.length) return false;
    for (let i: usize = 0; i < d.len; i++) {
      if (load<u8>(d.ptr + i) != <u8>lit.charCodeAt(<i32>i)) return false;
    }
    return true;
  }

  startsWith(lit: string): bool {
    const d = this.decoded();
    return at(d.ptr, d.len, 0, lit);
  }

  contains(lit: string): bool {
    const d = this.decoded();
    const n = <usize>lit.length;
    if (d.len < n) return false;
    for (let i: usize = 0; i + n <= d.len; i++) {
      if (at(d.ptr, d.len, i, lit)) return true;
    }
    return false;
  }
}

function at(ptr: usize, len: usize, off: usize, lit: string): bool {
  const n = <usize>lit.length;
  if (off + n > len) return false;
  for (let i: usize = 0; i < n; i++) {
    if (load<u8>(ptr + off + i) != <u8>lit.charCodeAt(<i32>i)) return false;
  }
  return true;
}

function hex(c: u32): i32 {
  if (c >= 0x30 && c <= 0x39) return <i32>(c - 0x30);
  if (c >= 0x61 && c <= 0x66) return <i32>(c - 0x61 + 10);
  if (c >= 0x41 && c <= 0x46) return <i32>(c - 0x41 + 10);
  return -1;
}

// unescape decodes valid JSON string content at src into dst (UTF-8) and
// returns its length; surrogate pairs become one code point.
function unescape(src: usize, len: usize, dst: usize): usize {
  let i: usize = 0;
  let n: usize = 0;
  while (i < len) {
    let c = <u32>load<u8>(src + i);
    if (c != 0x5c) {
      store<u8>(dst + n++, <u8>c);
      i++;
      continue;
    }
    const e = <u32>load<u8>(src + i + 1);
    i += 2;
    if (e == 0x6e) c = 0x0a;
    else if (e == 0x74) c = 0x09;
    else if (e == 0x72) c = 0x0d;
    else if (e == 0x62) c = 0x08;
    else if (e == 0x66) c = 0x0c;
    else if (e == 0x75) {
      c = <u32>((hex(load<u8>(src + i)) << 12) | (hex(load<u8>(src + i + 1)) << 8) | (hex(load<u8>(src + i + 2)) << 4) | hex(load<u8>(src + i + 3)));
      i += 4;
      if (c >= 0xd800 && c < 0xdc00 && i + 6 <= len && load<u8>(src + i) == 0x5c && load<u8>(src + i + 1) == 0x75) {
        const lo = <u32>((hex(load<u8>(src + i + 2)) << 12) | (hex(load<u8>(src + i + 3)) << 8) | (hex(load<u8>(src + i + 4)) << 4) | hex(load<u8>(src + i + 5)));
        if (lo >= 0xdc00 && lo < 0xe000) {
          c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
          i += 6;
        }
      }
      if (c >= 0xd800 && c < 0xe000) c = 0xfffd; // a lone surrogate
    } else c = e; // \" \\ \/
    if (c < 0x80) {
      store<u8>(dst + n++, <u8>c);
    } else if (c < 0x800) {
      store<u8>(dst + n++, <u8>(0xc0 | (c >> 6)));
      store<u8>(dst + n++, <u8>(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      store<u8>(dst + n++, <u8>(0xe0 | (c >> 12)));
      store<u8>(dst + n++, <u8>(0x80 | ((c >> 6) & 0x3f)));
      store<u8>(dst + n++, <u8>(0x80 | (c & 0x3f)));
    } else {
      store<u8>(dst + n++, <u8>(0xf0 | (c >> 18)));
      store<u8>(dst + n++, <u8>(0x80 | ((c >> 12) & 0x3f)));
      store<u8>(dst + n++, <u8>(0x80 | ((c >> 6) & 0x3f)));
      store<u8>(dst + n++, <u8>(0x80 | (c & 0x3f)));
    }
  }
  return n;
}

// ---- a validating scan of the input that keeps only what the rule reads ----

const MAX_DEPTH: i32 = 64;

// What the scan records for the value of a key it is inside: the input's
// top level, its "object", or the object's "service".
const AT_TOP: i32 = 0;
const AT_OBJECT: i32 = 1;
const AT_SERVICE: i32 = 2;
const AT_OTHER: i32 = 3;

class Scan {
  p: usize;
  end: usize;
  depth: i32 = 0;
  key: Span = new Span();

  hook: Span = new Span();
  objIsObject: bool = false;
  bundle: Span = new Span();
  image: Span = new Span();
  svcIsObject: bool = false;
  nodeIsObject: bool = false;
  slotIsScalar: bool = false;
  svcBundle: Span = new Span();
  svcImage: Span = new Span();

  constructor(ptr: usize, len: usize) {
    this.p = ptr;
    this.end = ptr + len;
  }

  // input reports whether the bytes are exactly one JSON object (with
  // whitespace around it), recording the values the rule needs.
  input(): bool {
    this.ws();
    if (this.p >= this.end || load<u8>(this.p) != 0x7b) return false;
    if (!this.object(AT_TOP)) return false;
    this.ws();
    return this.p == this.end;
  }

  ws(): void {
    while (this.p < this.end) {
      const c = load<u8>(this.p);
      if (c != 0x20 && c != 0x0a && c != 0x0d && c != 0x09) return;
      this.p++;
    }
  }

  // value checks one value; where says whose member it is and key names it.
  value(where: i32, into: Span | null): bool {
    this.ws();
    if (this.p >= this.end) return false;
    const c = load<u8>(this.p);
    if (c == 0x22) {
      const start = this.p + 1;
      const esc = this.string();
      if (esc < 0) return false;
      if (into != null) into.set(start, this.p - 1 - start, esc == 1);
      return true;
    }
    if (c == 0x7b) return this.object(where);
    if (c == 0x5b) return this.array();
    if (c == 0x74) return this.word("true");
    if (c == 0x66) return this.word("false");
    if (c == 0x6e) return this.word("null");
    return this.number();
  }

  // string moves past a string whose opening quote is at p: -1 when it is
  // not valid, 1 when it has escapes, else 0.
  string(): i32 {
    this.p++;
    let esc: i32 = 0;
    while (this.p < this.end) {
      const c = load<u8>(this.p);
      if (c == 0x22) {
        this.p++;
        return esc;
      }
      if (c < 0x20) return -1;
      if (c == 0x5c) {
        esc = 1;
        if (this.p + 1 >= this.end) return -1;
        const e = load<u8>(this.p + 1);
        if (e == 0x75) {
          if (this.p + 5 >= this.end) return -1;
          for (let i: usize = 2; i < 6; i++) if (hex(load<u8>(this.p + i)) < 0) return -1;
          this.p += 6;
          continue;
        }
        if (e != 0x22 && e != 0x5c && e != 0x2f && e != 0x62 && e != 0x66 && e != 0x6e && e != 0x72 && e != 0x74) return -1;
        this.p += 2;
        continue;
      }
      this.p++;
    }
    return -1;
  }

  word(w: string): bool {
    const n = <usize>w.length;
    if (!at(this.p, this.end - this.p, 0, w)) return false;
    this.p += n;
    return true;
  }

  number(): bool {
    const start = this.p;
    if (this.p < this.end && load<u8>(this.p) == 0x2d) this.p++;
    if (this.p >= this.end) return false;
    if (load<u8>(this.p) == 0x30) this.p++;
    else if (!this.digits()) return false;
    if (this.p < this.end && load<u8>(this.p) == 0x2e) {
      this.p++;
      if (!this.digits()) return false;
    }
    if (this.p < this.end && (load<u8>(this.p) | 0x20) == 0x65) {
      this.p++;
      if (this.p < this.end && (load<u8>(this.p) == 0x2b || load<u8>(this.p) == 0x2d)) this.p++;
      if (!this.digits()) return false;
    }
    return this.p > start;
  }

  digits(): bool {
    const start = this.p;
    while (this.p < this.end) {
      const c = load<u8>(this.p);
      if (c < 0x30 || c > 0x39) break;
      this.p++;
    }
    return this.p > start;
  }

  // object checks an object whose brace is at p, a member of where.
  object(where: i32): bool {
    this.p++;
    if (++this.depth > MAX_DEPTH) return false;
    this.ws();
    if (this.p < this.end && load<u8>(this.p) == 0x7d) {
      this.p++;
      this.depth--;
      return true;
    }
    while (true) {
      this.ws();
      if (this.p >= this.end || load<u8>(this.p) != 0x22) return false;
      const kstart = this.p + 1;
      const kesc = this.string();
      if (kesc < 0) return false;
      this.key.set(kstart, this.p - 1 - kstart, kesc == 1);
      this.ws();
      if (this.p >= this.end || load<u8>(this.p) != 0x3a) return false;
      this.p++;
      if (!this.member(where)) return false;
      this.ws();
      if (this.p >= this.end) return false;
      const c = load<u8>(this.p);
      this.p++;
      if (c == 0x7d) break;
      if (c != 0x2c) return false;
    }
    this.depth--;
    return true;
  }

  // member checks the value of key (just read) in an object of where,
  // recording it when the rule needs it. A key repeated counts as written
  // last, as Go's encoding/json reads it.
  member(where: i32): bool {
    this.ws();
    if (this.p >= this.end) return false;
    const c = load<u8>(this.p);
    const k = this.key;
    if (where == AT_TOP) {
      if (k.is("hook")) {
        this.hook.clear();
        return this.value(AT_OTHER, c == 0x22 ? this.hook : null);
      }
      if (k.is("object")) {
        this.objIsObject = c == 0x7b;
        this.bundle.clear();
        this.image.clear();
        this.svcIsObject = false;
        this.nodeIsObject = false;
        this.slotIsScalar = false;
        this.svcBundle.clear();
        this.svcImage.clear();
        return this.value(this.objIsObject ? AT_OBJECT : AT_OTHER, null);
      }
    } else if (where == AT_OBJECT) {
      if (k.is("bundle")) {
        this.bundle.clear();
        return this.value(AT_OTHER, c == 0x22 ? this.bundle : null);
      }
      if (k.is("image")) {
        this.image.clear();
        return this.value(AT_OTHER, c == 0x22 ? this.image : null);
      }
      if (k.is("service")) {
        this.svcIsObject = c == 0x7b;
        this.svcBundle.clear();
        this.svcImage.clear();
        return this.value(this.svcIsObject ? AT_SERVICE : AT_OTHER, null);
      }
      if (k.is("node")) {
        this.nodeIsObject = c == 0x7b;
        return this.value(AT_OTHER, null);
      }
      if (k.is("slot")) {
        this.slotIsScalar = c != 0x22 && c != 0x7b && c != 0x5b && c != 0x6e;
        return this.value(AT_OTHER, null);
      }
    } else if (where == AT_SERVICE) {
      if (k.is("bundle")) {
        this.svcBundle.clear();
        return this.value(AT_OTHER, c == 0x22 ? this.svcBundle : null);
      }
      if (k.is("image")) {
        this.svcImage.clear();
        return this.value(AT_OTHER, c == 0x22 ? this.svcImage : null);
      }
    }
    return this.value(AT_OTHER, null);
  }

  array(): bool {
    this.p++;
    if (++this.depth > MAX_DEPTH) return false;
    this.ws();
    if (this.p < this.end && load<u8>(this.p) == 0x5d) {
      this.p++;
      this.depth--;
      return true;
    }
    while (true) {
      if (!this.value(AT_OTHER, null)) return false;
      this.ws();
      if (this.p >= this.end) return false;
      const c = load<u8>(this.p);
      this.p++;
      if (c == 0x5d) break;
      if (c != 0x2c) return false;
    }
    this.depth--;
    return true;
  }
}
