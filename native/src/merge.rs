//! merge's second pass over a run (`distprof.analysis.merge`, issue 24): every event of the run rewritten for the
//! merged trace, byte for byte what the Python path writes (msgspec decoding each event into merge's `_Out`, the
//! `_FileWriter.fix` rule, msgspec encoding it back), without a Python object per event.
//!
//! Two calls. `dp_merge_parse` reads the run and tells Python the run's distinct pids (raw tokens, first seen first:
//! merge numbers a file's pids in that order) and its `process_name` metadata events (whose args merge rewrites);
//! Python answers with each pid's output number and each such event's new args, and `dp_merge_emit` writes the
//! events. Strict like the scanner: wherever the Python path would decide something this code does not (a string or
//! key written with escapes, a field of the wrong type, a string, negative or large flow id, `id2`, `tts`/`tdur`, a
//! time beyond what is written exactly as whole ns), the status is 1 and Python writes the run.
use super::*;

/// _Out's fields, in the order msgspec writes them.
const F_PH: usize = 0;
const F_CAT: usize = 1;
const F_NAME: usize = 2;
const F_PID: usize = 3;
const F_TID: usize = 4;
const F_TS: usize = 5;
const F_DUR: usize = 6;
const F_ARGS: usize = 7;
const F_ID: usize = 8;
const F_BP: usize = 9;
const F_S: usize = 10;
const F_TTS: usize = 11;
const F_TDUR: usize = 12;
const F_ID2: usize = 13;
const F_SCOPE: usize = 14;
const F_CNAME: usize = 15;
const F_SF: usize = 16;
const F_ESF: usize = 17;
const F_STACK: usize = 18;
const F_ESTACK: usize = 19;
const F_BIND: usize = 20;
const F_FIN: usize = 21;
const F_FOUT: usize = 22;
const NAMES: [&[u8]; 23] = [
    b"ph", b"cat", b"name", b"pid", b"tid", b"ts", b"dur", b"args", b"id", b"bp", b"s", b"tts", b"tdur", b"id2",
    b"scope", b"cname", b"sf", b"esf", b"stack", b"estack", b"bind_id", b"flow_in", b"flow_out",
];

/// merge.FLOW_STRIDE: a file's flow ids are index * FLOW_STRIDE + id, for ids in [0, FLOW_STRIDE / 2).
const FLOW_STRIDE: i64 = 10_000_000_000;
/// Written times in ns: below 2^43 µs a double holds every ns exactly apart, and msgspec writes it as the decimal
/// (checked against msgspec in tests/unit/analysis/test_merge_native.py); beyond, the Python path writes it.
const MAX_NS: i64 = 8_000_000_000_000_000;

/// A hole in the written bytes that Python's answers fill (dp_merge_emit): an output pid, or new process_name args.
const HOLE_PID: u32 = 0;
const HOLE_ARGS: u32 = 1;

#[derive(Default)]
pub struct MergeRun {
    status: u32,
    err_at: u64,
    events: u64,
    draft: Vec<u8>,                // the events as written, with holes
    holes: Vec<(usize, u32, u32)>, // (offset in draft, HOLE_*, pid number or process_name number)
    pid_blob: Vec<u8>,
    pid_off: Vec<u64>,
    pn_pid: Vec<u32>,
    pn_off: Vec<u64>,
    pn_len: Vec<u64>,
    out: Vec<u8>,
}

/// A field's value as the JSON says it: null, a plain string (span inside the quotes), an int64, another number,
/// or anything else (checked and skipped); with the value's span (a string's with its quotes).
#[derive(Clone, Copy)]
enum J {
    Absent,
    Null,
    Str(usize, usize),
    Int(i64),
    Num(f64),
    Other,
}

fn jvalue(p: &mut P) -> R<(J, usize, usize)> {
    let start = {
        p.ws();
        p.i
    };
    let j = match p.peek()? {
        b'n' => p.lit(b"null").map(|_| J::Null)?,
        b'"' => {
            let (s, e, esc) = p.string()?;
            if esc {
                return Err(Unsure(s)); // msgspec writes it back unescaped
            }
            J::Str(s, e)
        }
        b'-' | b'0'..=b'9' => {
            let (s, e, int) = p.number()?;
            match if int { parse_i64(&p.b[s..e]) } else { None } {
                Some(v) => J::Int(v),
                None => J::Num(parse_f64(&p.b[s..e], int).ok_or(Unsure(s))?),
            }
        }
        _ => {
            p.skip(1)?;
            J::Other
        }
    };
    Ok((j, start, p.i))
}

/// ts / dur (msgspec's bounded float; an int is read as one).
fn time(v: &J, lo: f64) -> Option<f64> {
    let t = match *v {
        J::Int(i) => i as f64, // exact below 2^53; above, the bounds refuse it anyway or it equals msgspec's cast
        J::Num(f) => f,
        _ => return None,
    };
    if (lo..=9e15).contains(&t) { Some(t) } else { None }
}

/// Python's `round(x)` (ties to even) as an int64, None when it does not fit comfortably.
fn round_even(x: f64) -> Option<i64> {
    let r = x.round_ties_even();
    if r.abs() < 9e18 { Some(r as i64) } else { None }
}

/// A pid as merge's pid numbering tells them apart: by value (an int), by its bytes (a string), or absent.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key<'a> {
    Absent,
    Int(i64),
    Str(&'a [u8]),
}

struct Parser<'a> {
    first: f64,
    start_ns: i64,
    index: i64,
    pids: FxMap<Key<'a>, u32>,
    run: MergeRun,
}

impl<'a> Parser<'a> {
    /// The pid's number in the run; a new one's token goes to the blob (an int's decimal, a string with its
    /// quotes, empty when absent), first seen first.
    fn pid(&mut self, k: Key<'a>) -> u32 {
        if let Some(&n) = self.pids.get(&k) {
            return n;
        }
        let n = self.pids.len() as u32;
        self.pids.insert(k, n);
        self.run.pid_off.push(self.run.pid_blob.len() as u64);
        match k {
            Key::Absent => {}
            Key::Int(i) => itoa(&mut self.run.pid_blob, i),
            Key::Str(t) => self.run.pid_blob.extend_from_slice(t),
        }
        n
    }

    fn event(&mut self, p: &mut P<'a>) -> R<()> {
        let at = p.i;
        let u = Unsure(at);
        let mut v = [J::Absent; 23];
        let mut sp = [(0usize, 0usize); 23];
        let mut seen = 0u32;
        p.members(|p, (s, e, esc)| {
        if esc {
            return Err(Unsure(s));
        }
        match field(&p.b[s..e]) {
            Some(k) => {
                if seen & (1 << k) != 0 {
                    return Err(Unsure(s)); // a field given twice
                }
                seen |= 1 << k;
                let (j, a, e) = jvalue(p)?;
                v[k] = j;
                sp[k] = (a, e);
            }
            None => p.skip(1)?,
        }
            Ok(())
        })?;
        let b = p.b;
        // strings: ph, cat, name (left out when empty); bp, s, scope, cname (or null, left out)
        let text = |k: usize| -> R<&'a [u8]> {
            match v[k] {
                J::Absent => Ok(b""),
                J::Str(s, e) => Ok(&b[s..e]),
                J::Null if k >= F_BP => Ok(b""),
                _ => Err(Unsure(at)),
            }
        };
        let (ph, cat, name) = (text(F_PH)?, text(F_CAT)?, text(F_NAME)?);
        // (bp, s, scope, cname default to None: only null is left out; an empty string is written)
        for k in [F_BP, F_S, F_SCOPE, F_CNAME] {
            text(k)?;
        }
        let pid = match v[F_PID] {
            J::Absent => self.pid(Key::Absent),
            J::Int(i) => self.pid(Key::Int(i)),
            J::Str(s, e) => self.pid(Key::Str(&b[s - 1..e + 1])),
            _ => return Err(u),
        };
        if !matches!(v[F_TID], J::Absent | J::Int(_) | J::Str(..)) {
            return Err(u);
        }
        let dur = match v[F_DUR] {
            J::Absent => None,
            j => Some(time(&j, 0.0).ok_or(Unsure(at))?),
        };
        let ts = match v[F_TS] {
            J::Absent => None,
            j => Some(time(&j, -9e15).ok_or(Unsure(at))?),
        };
        let rounded = |d: f64| -> R<i64> {
            let n = round_even(d * 1000.0).ok_or(Unsure(at))?;
            if n.abs() < MAX_NS { Ok(n) } else { Err(Unsure(at)) }
        };
        let m = ph == b"M";
        let (ts_ns, dur_ns) = if m {
            (None, match dur {
                Some(d) if d != 0.0 => Some(rounded(d)?),
                _ => None,
            })
        } else {
            let r = round_even((ts.unwrap_or(0.0) - self.first) * 1000.0).ok_or(Unsure(at))?;
            let n = self.start_ns.checked_add(r).filter(|n| n.abs() < MAX_NS).ok_or(Unsure(at))?;
            (Some(n), match dur {
                None if ph == b"X" => Some(0),
                Some(d) if ph == b"X" || d != 0.0 => Some(rounded(d)?),
                _ => None,
            })
        };
        let pn = m && name == b"process_name";
        if pn && !matches!(v[F_ARGS], J::Absent | J::Other) {
            return Err(u); // args not an object or array: Python reads the name
        }
        // flow ids: int64 in [0, FLOW_STRIDE / 2) (others: Python's numbering), or null
        let flow = |k: usize| -> R<Option<i64>> {
            match v[k] {
                J::Absent | J::Null => Ok(None),
                J::Int(i) if (0..FLOW_STRIDE / 2).contains(&i) => {
                    self.index.checked_mul(FLOW_STRIDE).and_then(|x| x.checked_add(i)).map(Some).ok_or(Unsure(at))
                }
                _ => Err(Unsure(at)),
            }
        };
        let (id, bind) = (flow(F_ID)?, flow(F_BIND)?);
        for k in [F_SF, F_ESF] {
            if !matches!(v[k], J::Absent | J::Null | J::Int(_) | J::Str(..)) {
                return Err(u);
            }
        }
        for k in [F_FIN, F_FOUT] {
            match v[k] {
                J::Absent | J::Null => {}
                J::Other if matches!(&b[sp[k].0..sp[k].1], b"true" | b"false") => {}
                _ => return Err(u),
            }
        }
        for k in [F_TTS, F_TDUR, F_ID2] {
            match v[k] {
                J::Absent => {}
                J::Null if k != F_ID2 => {}
                _ => return Err(u), // floats written back by msgspec; id2 rescoped by Python
            }
        }
        // written in _Out's order
        let o = &mut self.run.draft;
        if self.run.events > 0 {
            o.push(b',');
        }
        self.run.events += 1;
        o.push(b'{');
        let mut w = W { o, first: true };
        w.text(F_PH, ph);
        w.text(F_CAT, cat);
        w.text(F_NAME, name);
        w.key(F_PID);
        self.run.holes.push((w.o.len(), HOLE_PID, pid));
        w.key(F_TID);
        match v[F_TID] {
            J::Int(i) => itoa(w.o, i),
            J::Str(s, e) => w.o.extend_from_slice(&b[s - 1..e + 1]),
            _ => w.o.push(b'0'),
        }
        if let Some(n) = ts_ns {
            w.key(F_TS);
            write_ns(w.o, n);
        }
        if let Some(n) = dur_ns {
            w.key(F_DUR);
            write_ns(w.o, n);
        }
        if pn {
            w.key(F_ARGS);
            let n = self.run.pn_pid.len() as u32;
            self.run.holes.push((w.o.len(), HOLE_ARGS, n));
            self.run.pn_pid.push(pid);
            let (s, e) = if matches!(v[F_ARGS], J::Absent) { (0, 0) } else { sp[F_ARGS] };
            self.run.pn_off.push(s as u64);
            self.run.pn_len.push((e - s) as u64);
        } else {
            w.raw(F_ARGS, &v, &sp, b);
        }
        if let Some(i) = id {
            w.key(F_ID);
            itoa(w.o, i);
        }
        for k in [F_BP, F_S, F_SCOPE, F_CNAME] {
            if let J::Str(s, e) = v[k] {
                w.key(k);
                w.o.extend_from_slice(&b[s - 1..e + 1]);
            }
        }
        for k in [F_SF, F_ESF] {
            match v[k] {
                J::Int(i) => {
                    w.key(k);
                    itoa(w.o, i);
                }
                J::Str(s, e) => {
                    w.key(k);
                    w.o.extend_from_slice(&b[s - 1..e + 1]);
                }
                _ => {}
            }
        }
        w.raw(F_STACK, &v, &sp, b);
        w.raw(F_ESTACK, &v, &sp, b);
        if let Some(i) = bind {
            w.key(F_BIND);
            itoa(w.o, i);
        }
        for k in [F_FIN, F_FOUT] {
            if matches!(v[k], J::Other) {
                w.raw(k, &v, &sp, b);
            }
        }
        w.o.push(b'}');
        Ok(())
    }
}

/// The field an event's key names (None: a key merge does not keep).
#[inline]
fn field(k: &[u8]) -> Option<usize> {
    Some(match k {
        b"ph" => F_PH,
        b"cat" => F_CAT,
        b"name" => F_NAME,
        b"pid" => F_PID,
        b"tid" => F_TID,
        b"ts" => F_TS,
        b"dur" => F_DUR,
        b"args" => F_ARGS,
        b"id" => F_ID,
        b"bp" => F_BP,
        b"s" => F_S,
        b"tts" => F_TTS,
        b"tdur" => F_TDUR,
        b"id2" => F_ID2,
        b"scope" => F_SCOPE,
        b"cname" => F_CNAME,
        b"sf" => F_SF,
        b"esf" => F_ESF,
        b"stack" => F_STACK,
        b"estack" => F_ESTACK,
        b"bind_id" => F_BIND,
        b"flow_in" => F_FIN,
        b"flow_out" => F_FOUT,
        _ => return None,
    })
}

/// One event's fields as they are written (`"key":` with the commas between them).
struct W<'o> {
    o: &'o mut Vec<u8>,
    first: bool,
}

impl W<'_> {
    #[inline]
    fn key(&mut self, k: usize) {
        if !self.first {
            self.o.push(b',');
        }
        self.first = false;
        self.o.push(b'"');
        self.o.extend_from_slice(NAMES[k]);
        self.o.extend_from_slice(b"\":");
    }
    /// A string field whose default is "" (ph, cat, name): left out when empty, as msgspec leaves out a default.
    #[inline]
    fn text(&mut self, k: usize, t: &[u8]) {
        if !t.is_empty() {
            self.key(k);
            self.o.push(b'"');
            self.o.extend_from_slice(t);
            self.o.push(b'"');
        }
    }
    /// A raw JSON value as read (args, stacks, flow_in / flow_out).
    #[inline]
    fn raw(&mut self, k: usize, v: &[J; 23], sp: &[(usize, usize); 23], b: &[u8]) {
        if !matches!(v[k], J::Absent) {
            self.key(k);
            self.o.extend_from_slice(&b[sp[k].0..sp[k].1]);
        }
    }
}

/// An i64 in decimal, as msgspec writes an int.
#[inline]
fn itoa(o: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut a = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (a % 10) as u8;
        a /= 10;
        if a == 0 {
            break;
        }
    }
    if v < 0 {
        o.push(b'-');
    }
    o.extend_from_slice(&buf[i..]);
}

fn parse_run(b: &[u8], first: f64, start_ns: i64, index: i64) -> MergeRun {
    let mut ps = Parser { first, start_ns, index, pids: FxMap::default(), run: MergeRun::default() };
    let res = each_event(b, |p| ps.event(p));
    if let Err(Unsure(at)) = res {
        return MergeRun { status: 1, err_at: at as u64, ..MergeRun::default() };
    }
    ps.run.pid_off.push(ps.run.pid_blob.len() as u64);
    ps.run
}

/// Whole ns as msgspec writes ns / 1000.0 (below MAX_NS: the decimal, at least one digit after the point).
fn write_ns(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    let a = n.unsigned_abs();
    itoa(out, (a / 1000) as i64);
    out.push(b'.');
    let f = a % 1000;
    let digits = [b'0' + (f / 100) as u8, b'0' + (f / 10 % 10) as u8, b'0' + (f % 10) as u8];
    let keep = if f == 0 { 1 } else { 3 - digits.iter().rev().take_while(|&&d| d == b'0').count() };
    out.extend_from_slice(&digits[..keep]);
}

fn emit(r: &mut MergeRun, pids: &[i64], pn_blob: &[u8], pn_off: &[u64]) -> bool {
    let mut out = Vec::with_capacity(r.draft.len() + 16 * r.holes.len() + pn_blob.len());
    let mut at = 0;
    for &(off, kind, n) in &r.holes {
        out.extend_from_slice(&r.draft[at..off]);
        at = off;
        let n = n as usize;
        if kind == HOLE_PID {
            match pids.get(n) {
                Some(&v) => itoa(&mut out, v),
                None => return false,
            }
        } else {
            match (pn_off.get(n), pn_off.get(n + 1)) {
                (Some(&s), Some(&e)) if s <= e && (e as usize) <= pn_blob.len() => {
                    out.extend_from_slice(&pn_blob[s as usize..e as usize])
                }
                _ => return false,
            }
        }
    }
    out.extend_from_slice(&r.draft[at..]);
    r.out = out;
    true
}

/// Parse the run of `len` bytes at `data` for merge's second pass (the file's earliest ts `first`, its start
/// `start_ns` after the clock base, its index in the output); always a handle (free it with dp_merge_free).
///
/// # Safety
/// `data` must point to `len` readable bytes (or be null with len 0), unchanged until dp_merge_emit returns.
#[no_mangle]
pub unsafe extern "C" fn dp_merge_parse(data: *const u8, len: usize, first: f64, start_ns: i64, index: i64)
    -> *mut MergeRun {
    let b: &[u8] = if data.is_null() || len == 0 { &[] } else { std::slice::from_raw_parts(data, len) };
    let r = std::panic::catch_unwind(|| parse_run(b, first, start_ns, index))
        .unwrap_or(MergeRun { status: 2, ..MergeRun::default() });
    Box::into_raw(Box::new(r))
}

/// Write the events: `pids[n]` is the output pid of the run's pid token n, `pn_blob` / `pn_off` (n + 1 offsets)
/// the args of its process_name events. Returns the status (0: written, 1: not sure, 2: inputs that do not fit).
///
/// # Safety
/// `h` from dp_merge_parse (not freed), `data` / `len` as given to it; the arrays readable at their lengths.
#[no_mangle]
pub unsafe extern "C" fn dp_merge_emit(h: *mut MergeRun, data: *const u8, len: usize, pids: *const i64,
                                       npids: usize, pn_blob: *const u8, nblob: usize, pn_off: *const u64,
                                       noff: usize) -> u32 {
    if h.is_null() {
        return 2;
    }
    let r = &mut *h;
    if r.status != 0 {
        return r.status;
    }
    unsafe fn sl<'x, T>(p: *const T, n: usize) -> &'x [T] {
        if p.is_null() || n == 0 { &[] } else { std::slice::from_raw_parts(p, n) }
    }
    let (b, pids, blob, off) = (sl(data, len), sl(pids, npids), sl(pn_blob, nblob), sl(pn_off, noff));
    let _ = b; // (the draft holds the copied bytes already)
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| emit(r, pids, blob, off))).unwrap_or(false);
    if !ok {
        r.status = 2;
    }
    r.status
}

/// 0: status; 1: where it stopped; 2: the events.
///
/// # Safety
/// `h` from dp_merge_parse, not freed.
#[no_mangle]
pub unsafe extern "C" fn dp_merge_info(h: *const MergeRun, which: u32) -> u64 {
    if h.is_null() {
        return 0;
    }
    let r = &*h;
    match which {
        0 => r.status as u64,
        1 => r.err_at,
        2 => r.events,
        _ => 0,
    }
}

/// 0: the pid tokens' blob, 1: their offsets (n + 1), 2: process_name events' pid numbers, 3 / 4: their args'
/// offsets / lengths, 5: the written events.
///
/// # Safety
/// `h` from dp_merge_parse, not freed; `n` writable.
#[no_mangle]
pub unsafe extern "C" fn dp_merge_column(h: *const MergeRun, which: u32, n: *mut u64) -> *const u8 {
    if h.is_null() || n.is_null() {
        return std::ptr::null();
    }
    let r = &*h;
    match which {
        0 => col!(n, r.pid_blob),
        1 => col!(n, r.pid_off),
        2 => col!(n, r.pn_pid),
        3 => col!(n, r.pn_off),
        4 => col!(n, r.pn_len),
        5 => col!(n, r.out),
        _ => {
            *n = 0;
            std::ptr::null()
        }
    }
}

/// # Safety
/// `h` from dp_merge_parse, freed once.
#[no_mangle]
pub unsafe extern "C" fn dp_merge_free(h: *mut MergeRun) {
    if !h.is_null() {
        drop(Box::from_raw(h));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(n: i64) -> String {
        let mut v = Vec::new();
        write_ns(&mut v, n);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn writes_ns_as_msgspec_writes_the_double() {
        assert_eq!(ns(0), "0.0");
        assert_eq!(ns(1), "0.001");
        assert_eq!(ns(1500), "1.5");
        assert_eq!(ns(-1234010), "-1234.01");
        assert_eq!(ns(1000), "1.0");
    }

    #[test]
    fn rewrites_a_run() {
        let s = br#"[{"name":"k","ph":"X","ts":2.0015,"dur":1,"pid":7,"tid":"t","args":{"a": 1},"junk":[1]},{"ph":"M","name":"process_name","pid":7,"args":{"name":"p"}},{"ph":"s","id":5,"ts":3,"pid":"q"}]"#;
        let mut r = parse_run(s, 1.0, 5, 2);
        assert_eq!(r.status, 0);
        assert_eq!(r.pid_off, vec![0, 1, 4]);
        assert!(emit(&mut r, &[2000, 2001], b"{\"name\":\"x\"}", &[0, 12]));
        assert_eq!(
            String::from_utf8(r.out).unwrap(),
            r#"{"ph":"X","name":"k","pid":2000,"tid":"t","ts":1.007,"dur":1.0,"args":{"a": 1}},{"ph":"M","name":"process_name","pid":2000,"tid":0,"args":{"name":"x"}},{"ph":"s","pid":2001,"tid":0,"ts":2.005,"id":20000000005}"#
        );
    }

    #[test]
    fn an_empty_string_is_written_where_the_default_is_none() {
        let s = br#"[{"ph":"X","bp":"","s":null,"cname":"","cat":""}]"#;
        let mut r = parse_run(s, 0.0, 0, 0);
        assert!(emit(&mut r, &[1], b"", &[0]));
        assert_eq!(String::from_utf8(r.out).unwrap(), r#"{"ph":"X","pid":1,"tid":0,"ts":0.0,"dur":0.0,"bp":"","cname":""}"#);
    }

    #[test]
    fn is_unsure_where_python_decides() {
        for s in [
            r#"[{"ph":"X","id":"0x1f"}]"#,
            r#"[{"ph":"X","id":-1}]"#,
            r#"[{"ph":"X","name":"a\"b"}]"#,
            r#"[{"ph":"X","id2":{"global":1}}]"#,
            r#"[{"ph":"X","tts":1.5}]"#,
            r#"[{"ph":"X","ts":"1"}]"#,
            r#"[{"ph":"X","ts":1e16}]"#,
            r#"[{"ph":"X","pid":1.5}]"#,
            r#"[{"ph":"X","ph":"X"}]"#,
            r#"[{"ph":"X","flow_in":1}]"#,
            r#"[{"ph":null}]"#,
        ] {
            assert_eq!(parse_run(s.as_bytes(), 0.0, 0, 0).status, 1, "{s}");
        }
    }
}
