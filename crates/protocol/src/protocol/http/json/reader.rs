//! The recursive-descent reader behind [`super::parse`] and [`super::visit_scalars`]. Recursion is
//! bounded: values deeper than [`MAX_DEPTH`] are validated by [`Reader::skip`], which keeps its
//! open containers on the heap, and `data` arrays stop at [`MAX_DATA_DEPTH`].

use super::{Number, ParseError, Scalar, Value, VisitError, MAX_DATA_DEPTH, MAX_DEPTH, MAX_VALUES};
use std::borrow::Cow;

pub(super) struct Reader<'a> {
    pub(super) src: &'a [u8],
    pub(super) pos: usize,
    /// How many more values `value` may build.
    pub(super) budget: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            message: message.into(),
            offset: self.pos,
        }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    pub(super) fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), ParseError> {
        if self.src[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.error("Invalid value."))
        }
    }

    pub(super) fn value(
        &mut self,
        depth: usize,
        lazy_key: Option<&str>,
    ) -> Result<Value<'a>, ParseError> {
        self.budget = self.budget.checked_sub(1).ok_or_else(|| {
            self.error(format!(
                "JSON has more than {MAX_VALUES} values outside tensor 'data'"
            ))
        })?;
        if depth > MAX_DEPTH && matches!(self.peek(), Some(b'[' | b'{')) {
            // Triton's parser reads any depth (rapidjson's iterative mode, common PR #156) and no
            // handler looks this deep: the value is validated and kept as its source text.
            let start = self.pos;
            self.skip()?;
            return Ok(Value::Raw(&self.src[start..self.pos]));
        }
        match self.peek() {
            Some(b'{') => self.object(depth, lazy_key),
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                loop {
                    self.skip_ws();
                    items.push(self.value(depth + 1, lazy_key)?);
                    if self.separator(b']', MISSING_ARRAY_SEPARATOR)? {
                        return Ok(Value::Array(items));
                    }
                }
            }
            Some(b'"') => self.text().map(Value::String),
            Some(b't') => self.literal("true").map(|()| Value::Bool(true)),
            Some(b'f') => self.literal("false").map(|()| Value::Bool(false)),
            Some(b'n') => self.literal("null").map(|()| Value::Null),
            _ => self.number().map(Value::Number),
        }
    }

    fn object(&mut self, depth: usize, lazy_key: Option<&str>) -> Result<Value<'a>, ParseError> {
        self.pos += 1;
        let mut members = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.error("Missing a name for object member."));
            }
            let key = self.text()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.error("Missing a colon after a name of object member."));
            }
            self.pos += 1;
            self.skip_ws();
            let value = if lazy_key == Some(&*key) {
                let start = self.pos;
                self.skip()?;
                Value::Raw(&self.src[start..self.pos])
            } else {
                self.value(depth + 1, lazy_key)?
            };
            members.push((key, value));
            if self.separator(b'}', MISSING_MEMBER_SEPARATOR)? {
                return Ok(Value::Object(members));
            }
        }
    }

    /// After an element: `true` at the closing byte, `false` after a comma.
    fn separator(&mut self, close: u8, message: &str) -> Result<bool, ParseError> {
        self.skip_ws();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b) if b == close => {
                self.pos += 1;
                Ok(true)
            }
            _ => Err(self.error(message)),
        }
    }

    /// Validates a value without building it, however deep: the open containers are kept on the
    /// heap (one byte each, bounded by the body), never on the call stack.
    fn skip(&mut self) -> Result<(), ParseError> {
        // The closing byte of each open container, innermost last.
        let mut open: Vec<u8> = Vec::new();
        loop {
            match self.peek() {
                Some(b @ (b'[' | b'{')) => {
                    let close = if b == b'[' { b']' } else { b'}' };
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() != Some(close) {
                        open.push(close);
                        if close == b'}' {
                            self.member_name()?;
                        }
                        continue;
                    }
                    self.pos += 1;
                }
                Some(b'"') => self.string(None)?,
                Some(b't') => self.literal("true")?,
                Some(b'f') => self.literal("false")?,
                Some(b'n') => self.literal("null")?,
                _ => self.skip_number()?,
            }
            // A value ended: close what it ends, or go on to the next element.
            loop {
                let Some(&close) = open.last() else {
                    return Ok(());
                };
                let missing = if close == b']' {
                    MISSING_ARRAY_SEPARATOR
                } else {
                    MISSING_MEMBER_SEPARATOR
                };
                if self.separator(close, missing)? {
                    open.pop();
                    continue;
                }
                self.skip_ws();
                if close == b'}' {
                    self.member_name()?;
                }
                break;
            }
        }
    }

    /// An object member's name and colon, and the whitespace before its value.
    fn member_name(&mut self) -> Result<(), ParseError> {
        if self.peek() != Some(b'"') {
            return Err(self.error("Missing a name for object member."));
        }
        self.string(None)?;
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(self.error("Missing a colon after a name of object member."));
        }
        self.pos += 1;
        self.skip_ws();
        Ok(())
    }

    pub(super) fn visit(
        &mut self,
        depth: usize,
        visit: &mut impl FnMut(Scalar<'_>) -> Result<(), String>,
        scratch: &mut Vec<u8>,
    ) -> Result<(), VisitError> {
        let scalar = match self.peek() {
            Some(b'[') => {
                if depth > MAX_DATA_DEPTH {
                    return Err(VisitError::TooDeep);
                }
                self.pos += 1;
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                    return Ok(());
                }
                loop {
                    self.skip_ws();
                    self.visit(depth + 1, visit, scratch)?;
                    if self.separator(b']', MISSING_ARRAY_SEPARATOR)? {
                        return Ok(());
                    }
                }
            }
            Some(b'{') => {
                return Err(VisitError::Syntax(
                    self.error("objects are not allowed in 'data'"),
                ))
            }
            Some(b'"') => {
                scratch.clear();
                self.string(Some(scratch))?;
                Scalar::String(scratch)
            }
            Some(b't') => self.literal("true").map(|()| Scalar::Bool(true))?,
            Some(b'f') => self.literal("false").map(|()| Scalar::Bool(false))?,
            Some(b'n') => self.literal("null").map(|()| Scalar::Null)?,
            _ => Scalar::Number(self.number()?),
        };
        visit(scalar).map_err(VisitError::Visitor)
    }

    /// Reads a string: borrowed from the source when it holds no escape (member names and most
    /// values), else unescaped into a new one.
    fn text(&mut self) -> Result<Cow<'a, str>, ParseError> {
        let start = self.pos + 1;
        let plain = self.src[start..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            .map(|len| start + len)
            .filter(|&end| self.src[end] == b'"');
        let invalid = |reader: &Self| reader.error("Invalid encoding in string.");
        if let Some(end) = plain {
            self.pos = end + 1;
            return std::str::from_utf8(&self.src[start..end])
                .map(Cow::Borrowed)
                .map_err(|_| invalid(self));
        }
        let mut bytes = Vec::new();
        self.string(Some(&mut bytes))?;
        String::from_utf8(bytes)
            .map(Cow::Owned)
            .map_err(|_| invalid(self))
    }

    /// Reads a string, unescaping into `out` when given.
    fn string(&mut self, mut out: Option<&mut Vec<u8>>) -> Result<(), ParseError> {
        self.pos += 1; // the opening quote
        loop {
            let run_start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            if let Some(out) = out.as_deref_mut() {
                out.extend_from_slice(&self.src[run_start..self.pos]);
            }
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = self.escape()?;
                    if let Some(out) = out.as_deref_mut() {
                        let mut buf = [0; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
                Some(_) => return Err(self.error("Invalid encoding in string.")),
                None => return Err(self.error("Missing a closing quotation mark in string.")),
            }
        }
    }

    fn escape(&mut self) -> Result<char, ParseError> {
        let Some(b) = self.peek() else {
            return Err(self.error("Missing a closing quotation mark in string."));
        };
        self.pos += 1;
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let high = self.hex4()?;
                let code = if (0xD800..0xDC00).contains(&high) {
                    if !self.src[self.pos..].starts_with(b"\\u") {
                        return Err(self.error("The surrogate pair in string is invalid."));
                    }
                    self.pos += 2;
                    let low = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(self.error("The surrogate pair in string is invalid."));
                    }
                    0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                } else {
                    high
                };
                char::from_u32(code)
                    .ok_or_else(|| self.error("The surrogate pair in string is invalid."))?
            }
            _ => return Err(self.error("Invalid escape character in string.")),
        })
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let digits = self
            .src
            .get(self.pos..self.pos + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.error("Incorrect hex digit after \\u escape in string."))?;
        self.pos += 4;
        Ok(digits)
    }

    /// Scans a run of digits and returns how many it scanned. With `FOLD`, the first
    /// [`EXACT_DIGITS`] of them are folded into `mantissa`; without, they are only checked (a
    /// member skipped now and visited later).
    fn digits<const FOLD: bool>(&mut self, mantissa: &mut Mantissa) -> usize {
        let start = self.pos;
        let mut pos = self.pos;
        // Eight at a time while they fit (tensor data is mostly long decimals).
        while !FOLD || mantissa.kept + 8 <= EXACT_DIGITS {
            let Some(word) = self.src.get(pos..pos + 8) else {
                break;
            };
            let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
            let Some(value) = eight_digits(word) else {
                break;
            };
            if FOLD {
                mantissa.value = mantissa.value * 100_000_000 + value;
                mantissa.kept += 8;
            }
            pos += 8;
        }
        while let Some(digit @ b'0'..=b'9') = self.src.get(pos).copied() {
            if FOLD {
                mantissa.push(digit - b'0');
            }
            pos += 1;
        }
        self.pos = pos;
        pos - start
    }

    /// A number, including rapidjson's `NaN`, `Inf` and `Infinity` with an optional minus.
    ///
    /// Tensor data is mostly numbers, so the common ones are converted as they are scanned:
    /// integers that fit 64 bits, and decimals of at most 19 digits with a small exponent
    /// ([`exact_decimal`]), both exactly. Anything else goes to the standard library's correctly
    /// rounded parser.
    fn number(&mut self) -> Result<Number, ParseError> {
        let start = self.pos;
        let (negative, scanned) = self.scan_number::<true>()?;
        let (mantissa, exponent, integer) = match scanned {
            Scanned::Special(value) => return Ok(Number::Float(value)),
            Scanned::Decimal {
                mantissa,
                exponent,
                integer,
            } => (mantissa, exponent, integer),
        };
        if !mantissa.dropped {
            let value = mantissa.value;
            if integer {
                if !negative {
                    return Ok(Number::Unsigned(value));
                }
                if let Some(v) = 0i64.checked_sub_unsigned(value) {
                    return Ok(Number::Negative(v));
                }
            } else if let Some(v) = exact_decimal(value, exponent) {
                return Ok(Number::Float(if negative { -v } else { v }));
            }
        }
        // The grammar admits only ASCII, so this cannot fail.
        let text = std::str::from_utf8(&self.src[start..self.pos]).unwrap_or("0");
        if integer {
            if negative {
                if let Ok(v) = text.parse::<i64>() {
                    return Ok(Number::Negative(v));
                }
            } else if let Ok(v) = text.parse::<u64>() {
                return Ok(Number::Unsigned(v));
            }
        }
        text.parse::<f64>()
            .map(Number::Float)
            .map_err(|_| self.error("Invalid value."))
    }

    /// Checks a number's grammar without converting it: the first pass over a member that is
    /// visited later (tensor data), so each number is converted once.
    fn skip_number(&mut self) -> Result<(), ParseError> {
        self.scan_number::<false>().map(drop)
    }

    /// Scans a number (rapidjson's grammar, see [`Reader::number`]) and says whether it had a
    /// minus sign. With `FOLD`, its digits are folded into the mantissa as they are scanned.
    fn scan_number<const FOLD: bool>(&mut self) -> Result<(bool, Scanned), ParseError> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let mut mantissa = Mantissa::default();
        match self.peek() {
            Some(b'N') => {
                self.literal("NaN")?;
                return Ok((negative, Scanned::Special(f64::NAN)));
            }
            Some(b'I') => {
                self.literal("Inf")?;
                if self.peek() == Some(b'i') {
                    self.literal("inity")?;
                }
                let inf = if negative {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                };
                return Ok((negative, Scanned::Special(inf)));
            }
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(self.error("Leading zeros are not allowed in numbers."));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits::<FOLD>(&mut mantissa);
            }
            _ => return Err(self.error("Invalid value.")),
        }
        let mut integer = true;
        let mut exponent: i64 = 0;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            integer = false;
            let before = mantissa.kept;
            if self.digits::<FOLD>(&mut mantissa) == 0 {
                return Err(self.error("Missing fraction part in number."));
            }
            exponent -= i64::from(mantissa.kept - before);
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            integer = false;
            let negative_exponent = self.peek() == Some(b'-');
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            let mut written: i64 = 0;
            let scanned = self.pos;
            while let Some(digit @ b'0'..=b'9') = self.peek() {
                // Saturates far beyond any finite double's exponent.
                written = (written * 10 + i64::from(digit - b'0')).min(1 << 40);
                self.pos += 1;
            }
            if self.pos == scanned {
                return Err(self.error("Missing exponent in number."));
            }
            exponent += if negative_exponent { -written } else { written };
        }
        Ok((
            negative,
            Scanned::Decimal {
                mantissa,
                exponent,
                integer,
            },
        ))
    }
}

/// What [`Reader::scan_number`] found.
enum Scanned {
    /// `NaN`, `Inf` or `Infinity`, with its sign.
    Special(f64),
    /// Digits (folded into `mantissa` if asked) times 10^`exponent`; `integer` when there was
    /// neither a fraction nor an exponent.
    Decimal {
        mantissa: Mantissa,
        exponent: i64,
        integer: bool,
    },
}

/// rapidjson's messages for a container element not followed by `,` or the closing bracket.
const MISSING_ARRAY_SEPARATOR: &str = "Missing a comma or ']' after an array element.";
const MISSING_MEMBER_SEPARATOR: &str = "Missing a comma or '}' after an object member.";

/// Significant digits that always fit a `u64`.
const EXACT_DIGITS: u32 = 19;

/// The digits of a number as they are scanned.
#[derive(Default)]
struct Mantissa {
    value: u64,
    /// Digits folded into `value` (leading zeros included: they cost nothing).
    kept: u32,
    /// A digit did not fit: the number needs the general parser.
    dropped: bool,
}

impl Mantissa {
    fn push(&mut self, digit: u8) {
        if self.kept < EXACT_DIGITS {
            self.value = self.value * 10 + u64::from(digit);
            self.kept += 1;
        } else {
            self.dropped = true;
        }
    }
}

/// The value of eight ASCII digits read as a little-endian word, or `None` if any byte is not a
/// digit (the well-known SWAR reduction: pairs, then quads, then the eight).
pub(super) fn eight_digits(word: u64) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    let high_nibbles = word & 0xF0F0_F0F0_F0F0_F0F0;
    let carries = (word.wrapping_add(0x0606_0606_0606_0606) & 0xF0F0_F0F0_F0F0_F0F0) >> 4;
    if high_nibbles | carries != 0x3333_3333_3333_3333 {
        return None;
    }
    let digits = word - ZEROS;
    let pairs = digits.wrapping_mul(10) + (digits >> 8);
    const LOW: u64 = 0x0000_00FF_0000_00FF;
    let quads = (pairs & LOW)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((pairs >> 16) & LOW).wrapping_mul(1 + (10_000 << 32)));
    Some(quads >> 32)
}

/// `mantissa × 10^exponent` correctly rounded, for the common shapes of decimals: one exact
/// operation on doubles when both operands are exact (Clinger's fast path), otherwise, for the
/// mantissas above 2^53 (16-19 digits: the floats Python clients widen to doubles), an exact
/// 128-bit product or a multiplication by a 128-bit reciprocal. `None` for the rest.
fn exact_decimal(mantissa: u64, exponent: i64) -> Option<f64> {
    /// Powers of ten a double holds exactly.
    const POWERS: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ];
    let clinger_power = usize::try_from(exponent.unsigned_abs())
        .ok()
        .and_then(|index| POWERS.get(index));
    if mantissa <= 1 << 53 {
        if let Some(&power) = clinger_power {
            #[allow(clippy::cast_precision_loss)] // at most 2^53: exact
            let mantissa = mantissa as f64;
            return Some(if exponent < 0 {
                mantissa / power
            } else {
                mantissa * power
            });
        }
    }
    if mantissa == 0 {
        return None;
    }
    match exponent {
        // Below 10^38 < 2^128: the product is exact, and the conversion rounds to nearest even.
        #[allow(clippy::cast_precision_loss)]
        0..=19 => Some((u128::from(mantissa) * 10u128.pow(exponent as u32)) as f64),
        -27..=-1 => Some(divide_by_power_of_ten(
            mantissa,
            exponent.unsigned_abs() as u32,
        )),
        _ => None,
    }
}

/// `mantissa / 10^k` correctly rounded, for `k` in 1..=27: the Eisel–Lemire method. The
/// mantissa, shifted up until its top bit is set, is multiplied by a 128-bit reciprocal of 5^k
/// ([`RECIPROCALS`]), and the top 55 bits of the product are the quotient with two bits to spare
/// for rounding. While 5^k < 2^64 the reciprocal is exact enough that the product never lands
/// where its truncation could change the rounding (the analysis behind fast_float's range of
/// "safe" exponents), so the only case to settle apart is a quotient exactly halfway between two
/// doubles, which only `k` ≤ 4 can produce. Two multiplications at most, in place of a 128-bit
/// division (the "widened by Python" JSON bench: 8.5 % faster).
pub(super) fn divide_by_power_of_ten(mantissa: u64, k: u32) -> f64 {
    debug_assert!(mantissa != 0 && (1..RECIPROCALS.len()).contains(&(k as usize)));
    let reciprocal = RECIPROCALS[k as usize];
    let leading = mantissa.leading_zeros();
    let normalized = u128::from(mantissa << leading);
    #[allow(clippy::cast_possible_truncation)] // the halves of a u128
    let (high, low) = ((reciprocal >> 64) as u64, reciprocal as u64);
    let mut product = normalized * u128::from(high);
    // Nine bits below the 55 kept all ones: the low half of the reciprocal may carry into them.
    // (At most (2^64 - 1)^2 plus less than 2^64: no overflow.)
    if (product >> 64) & 0x1FF == 0x1FF {
        product += (normalized * u128::from(low)) >> 64;
    }
    #[allow(clippy::cast_possible_truncation)]
    let (upper, lower) = ((product >> 64) as u64, product as u64);
    let top_bit = upper >> 63;
    let shift = 9 + top_bit as u32;
    let mut bits = upper >> shift;
    // Exactly halfway: only zeros were shifted out, so round to even instead of up.
    if lower <= 1 && k <= 4 && bits & 3 == 1 && bits << shift == upper {
        bits &= !1;
    }
    bits = (bits + (bits & 1)) >> 1;
    // floor(log2(10^-k)) + 63, with log2(10) ≈ 217706 / 2^16, then the normalization shift and
    // the bias. The value is at least 10^-27: always a normal double.
    let k = i64::from(k);
    let mut exponent = ((-217_706 * k) >> 16) + 63 + top_bit as i64 - i64::from(leading) + 1023;
    if bits >= 2 << 52 {
        // Rounding carried into a new bit.
        bits = 1 << 52;
        exponent += 1;
    }
    #[allow(clippy::cast_sign_loss)] // between 1 and 2046, as said above
    let exponent = exponent as u64;
    f64::from_bits((bits & !(1 << 52)) | exponent << 52)
}

/// `RECIPROCALS[k]` = ⌊2^(127 + b) / 5^k⌋ + 1 with `b` the bit length of 5^k: 5^-k scaled to
/// exactly 128 bits and rounded up, for `k` in 1..=27 (index 0 unused).
const RECIPROCALS: [u128; 28] = {
    let mut table = [0u128; 28];
    let mut k = 1;
    while k < table.len() {
        table[k] = reciprocal_of_power_of_five(k as u32);
        k += 1;
    }
    table
};

/// ⌊2^(127 + b) / 5^k⌋ + 1 (see [`RECIPROCALS`]) by long division, one bit at a time: the
/// numerator has more bits than any integer type, but the divisor and remainder fit 64.
const fn reciprocal_of_power_of_five(k: u32) -> u128 {
    let divisor = 5u128.pow(k);
    let bits = 128 - divisor.leading_zeros();
    let mut remainder = 0u128;
    let mut quotient = 0u128;
    // The numerator's bits from the top: a one at position 127 + bits, then zeros.
    let mut position = 127 + bits + 1;
    while position > 0 {
        position -= 1;
        remainder = (remainder << 1) | (position == 127 + bits) as u128;
        quotient <<= 1;
        if remainder >= divisor {
            remainder -= divisor;
            quotient |= 1;
        }
    }
    quotient + 1
}
