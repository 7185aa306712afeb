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
  const s = new Scan();
  if (!scanInput(s, <usize>ptr, <usize>len)) {
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
    const dst = this.ptr + this.n;
    const src = changetype<usize>(s);
    for (let i: usize = 0; i < n; i++) store<u8>(dst + i, <u8>unit(src, i));
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
    if (!this.escaped && this.len != <usize>lit.length) return false;
    const d = this.decoded();
    return d.len == <usize>lit.length && at(d.ptr, d.len, 0, lit);
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

// at reports whether the ASCII literal lit stands at off of the len bytes
// at ptr.
function at(ptr: usize, len: usize, off: usize, lit: string): bool {
  const n = <usize>lit.length;
  if (off + n > len) return false;
  const src = changetype<usize>(lit);
  for (let i: usize = 0; i < n; i++) {
    if (<u32>load<u8>(ptr + off + i) != unit(src, i)) return false;
  }
  return true;
}

// unit is the i-th UTF-16 code unit of the string at src, read without
// the bounds check of charCodeAt: callers stay below its length.
@inline
function unit(src: usize, i: usize): u32 {
  return <u32>load<u16>(src + (i << 1));
}

// special8 marks, in the top bit of each of the eight bytes of w, the
// bytes that are a quote, a backslash or a control byte (below 0x20); zero
// when there is none. The lowest mark is always right (a byte that is zero
// after the subtraction borrows only from the bytes above it), so
// ctz(mark) / 8 is the index of the first such byte. ~w keeps bytes of
// 0x80 and above from being marked.
@inline
function special8(w: u64): u64 {
  const ones: u64 = 0x0101010101010101;
  const tops: u64 = 0x8080808080808080;
  const q = w ^ 0x2222222222222222;
  const b = w ^ 0x5c5c5c5c5c5c5c5c;
  return (((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w)) & tops;
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
//
// The scan is a set of functions that take the position p and the end of
// the input and return the position after what they read, or 0 when the
// input is not valid there (no input starts at address 0). Positions stay
// in locals, which are registers; only what the rule needs is stored.

const MAX_DEPTH: i32 = 64;

// What the scan records for the value of a key it is inside: the input's
// top level, its "object", or the object's "service".
const AT_TOP: i32 = 0;
const AT_OBJECT: i32 = 1;
const AT_SERVICE: i32 = 2;
const AT_OTHER: i32 = 3;

// Scan is what one scan records.
class Scan {
  depth: i32 = 0;
  esc: bool = false; // the string read last has escapes
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
}

// scanInput reports whether the len bytes at ptr are exactly one JSON
// object (with whitespace around it), recording in s the values the rule
// needs.
function scanInput(s: Scan, ptr: usize, len: usize): bool {
  const end = ptr + len;
  const p = ws(ptr, end);
  if (p >= end || load<u8>(p) != 0x7b) return false;
  const q = object(s, p, end, AT_TOP);
  return q != 0 && ws(q, end) == end;
}

function ws(p: usize, end: usize): usize {
  if (p < end && load<u8>(p) > 0x20) return p; // compact JSON: no loop, no fuel
  while (p < end) {
    const c = load<u8>(p);
    if (c != 0x20 && c != 0x0a && c != 0x0d && c != 0x09) break;
    p++;
  }
  return p;
}

// value reads one value; where says whose member it is, and into, when
// not null, records it if it is a string.
function value(s: Scan, p: usize, end: usize, where: i32, into: Span | null): usize {
  p = ws(p, end);
  if (p >= end) return 0;
  const c = load<u8>(p);
  if (c == 0x22) {
    const q = str(s, p, end);
    if (q != 0 && into != null) into.set(p + 1, q - p - 2, s.esc);
    return q;
  }
  if (c == 0x7b) return object(s, p, end, where);
  if (c == 0x5b) return array(s, p, end);
  if (c == 0x74) return word(p, end, "true");
  if (c == 0x66) return word(p, end, "false");
  if (c == 0x6e) return word(p, end, "null");
  return number(p, end);
}

// str moves past the string whose opening quote is at p and sets s.esc
// when it has escapes. It looks at eight bytes at a time and jumps to the
// first that is a quote, a backslash or a control byte, so a string costs
// one step per eight bytes and one per such byte (each step of a loop also
// costs a unit of fuel, docs/wasm-abi.md section 3.3.1).
function str(s: Scan, p: usize, end: usize): usize {
  p++;
  let esc = false;
  while (true) {
    if (p + 8 <= end) {
      const m = special8(load<u64>(p));
      if (m == 0) {
        p += 8;
        continue;
      }
      p += <usize>(ctz<u64>(m) >> 3);
    } else if (p >= end) return 0;
    const c = load<u8>(p);
    if (c == 0x22) {
      s.esc = esc;
      return p + 1;
    }
    if (c < 0x20) return 0;
    if (c == 0x5c) {
      esc = true;
      if (p + 1 >= end) return 0;
      const e = load<u8>(p + 1);
      if (e == 0x75) {
        if (p + 5 >= end) return 0;
        if (hex(load<u8>(p + 2)) < 0 || hex(load<u8>(p + 3)) < 0 || hex(load<u8>(p + 4)) < 0 || hex(load<u8>(p + 5)) < 0) return 0;
        p += 6;
        continue;
      }
      if (e != 0x22 && e != 0x5c && e != 0x2f && e != 0x62 && e != 0x66 && e != 0x6e && e != 0x72 && e != 0x74) return 0;
      p += 2;
      continue;
    }
    p++;
  }
  return 0;
}

function word(p: usize, end: usize, w: string): usize {
  return at(p, end - p, 0, w) ? p + <usize>w.length : 0;
}

function number(p: usize, end: usize): usize {
  if (p < end && load<u8>(p) == 0x2d) p++;
  if (p >= end) return 0;
  if (load<u8>(p) == 0x30) p++;
  else {
    const q = digits(p, end);
    if (q == p) return 0;
    p = q;
  }
  if (p < end && load<u8>(p) == 0x2e) {
    const q = digits(p + 1, end);
    if (q == p + 1) return 0;
    p = q;
  }
  if (p < end && (load<u8>(p) | 0x20) == 0x65) {
    p++;
    if (p < end && (load<u8>(p) == 0x2b || load<u8>(p) == 0x2d)) p++;
    const q = digits(p, end);
    if (q == p) return 0;
    p = q;
  }
  return p;
}

function digits(p: usize, end: usize): usize {
  while (p < end) {
    const c = load<u8>(p);
    if (c < 0x30 || c > 0x39) break;
    p++;
  }
  return p;
}

// object reads the object whose brace is at p, a member of where.
function object(s: Scan, p: usize, end: usize, where: i32): usize {
  if (++s.depth > MAX_DEPTH) return 0;
  p = ws(p + 1, end);
  if (p < end && load<u8>(p) == 0x7d) {
    s.depth--;
    return p + 1;
  }
  while (true) {
    p = ws(p, end);
    if (p >= end || load<u8>(p) != 0x22) return 0;
    const q = str(s, p, end);
    if (q == 0) return 0;
    s.key.set(p + 1, q - p - 2, s.esc);
    p = ws(q, end);
    if (p >= end || load<u8>(p) != 0x3a) return 0;
    p = member(s, p + 1, end, where);
    if (p == 0) return 0;
    p = ws(p, end);
    if (p >= end) return 0;
    const c = load<u8>(p);
    p++;
    if (c == 0x7d) break;
    if (c != 0x2c) return 0;
  }
  s.depth--;
  return p;
}

// member reads the value of s.key (just read) in an object of where,
// recording it when the rule needs it. A key repeated counts as written
// last, as Go's encoding/json reads it.
function member(s: Scan, p: usize, end: usize, where: i32): usize {
  p = ws(p, end);
  if (p >= end) return 0;
  const c = load<u8>(p);
  const k = s.key;
  if (where == AT_TOP) {
    if (k.is("hook")) {
      s.hook.clear();
      return value(s, p, end, AT_OTHER, c == 0x22 ? s.hook : null);
    }
    if (k.is("object")) {
      s.objIsObject = c == 0x7b;
      s.bundle.clear();
      s.image.clear();
      s.svcIsObject = false;
      s.nodeIsObject = false;
      s.slotIsScalar = false;
      s.svcBundle.clear();
      s.svcImage.clear();
      return value(s, p, end, s.objIsObject ? AT_OBJECT : AT_OTHER, null);
    }
  } else if (where == AT_OBJECT) {
    if (k.is("bundle")) {
      s.bundle.clear();
      return value(s, p, end, AT_OTHER, c == 0x22 ? s.bundle : null);
    }
    if (k.is("image")) {
      s.image.clear();
      return value(s, p, end, AT_OTHER, c == 0x22 ? s.image : null);
    }
    if (k.is("service")) {
      s.svcIsObject = c == 0x7b;
      s.svcBundle.clear();
      s.svcImage.clear();
      return value(s, p, end, s.svcIsObject ? AT_SERVICE : AT_OTHER, null);
    }
    if (k.is("node")) {
      s.nodeIsObject = c == 0x7b;
      return value(s, p, end, AT_OTHER, null);
    }
    if (k.is("slot")) {
      s.slotIsScalar = c != 0x22 && c != 0x7b && c != 0x5b && c != 0x6e;
      return value(s, p, end, AT_OTHER, null);
    }
  } else if (where == AT_SERVICE) {
    if (k.is("bundle")) {
      s.svcBundle.clear();
      return value(s, p, end, AT_OTHER, c == 0x22 ? s.svcBundle : null);
    }
    if (k.is("image")) {
      s.svcImage.clear();
      return value(s, p, end, AT_OTHER, c == 0x22 ? s.svcImage : null);
    }
  }
  return value(s, p, end, AT_OTHER, null);
}

// array reads the array whose bracket is at p.
function array(s: Scan, p: usize, end: usize): usize {
  if (++s.depth > MAX_DEPTH) return 0;
  p = ws(p + 1, end);
  if (p < end && load<u8>(p) == 0x5d) {
    s.depth--;
    return p + 1;
  }
  while (true) {
    p = value(s, p, end, AT_OTHER, null);
    if (p == 0) return 0;
    p = ws(p, end);
    if (p >= end) return 0;
    const c = load<u8>(p);
    p++;
    if (c == 0x5d) break;
    if (c != 0x2c) return 0;
  }
  s.depth--;
  return p;
}
