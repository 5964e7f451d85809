//! gpumem's environment variables, all read and parsed one way.
//!
//! | variable | accepts | default |
//! |---|---|---|
//! | `GPUMEM_GPU_MEMORY_LIMIT` | a byte size (below) or a percentage of the device's memory (`40%`, `70.5%`) | no limit |
//! | `GPUMEM_EXPANDABLE_SEGMENTS` | a flag (below) | off |
//! | `GPUMEM_STITCH` | a flag (on implies `GPUMEM_EXPANDABLE_SEGMENTS`) | off |
//! | `GPUMEM_SHARE_ACROSS_STREAMS` | a flag | off |
//! | `GPUMEM_PLAN_AUTOMATICALLY` | a flag | off |
//! | `GPUMEM_PER_THREAD_DEFAULT_STREAM` | a flag | off |
//! | `GPUMEM_PAGEABLE_STAGING` | `off`, `auto`, or a byte size | `auto` |
//! | `GPUMEM_HOST_DEVICES` | a whole number from 1 to 64 | 2 |
//! | `GPUMEM_HOST_DEVICE_MEMORY` | a byte size | 16 GiB |
//! | `GPUMEM_BACKEND` (`gpumem-auto`) | `cuda`, `hip` or `host` | chosen by probing |
//!
//! - A **flag** is `1`, `true`, `yes` or `on`, or `0`, `false`, `no` or `off`, in any case.
//! - A **byte size** is a number of bytes, whole or with a fraction, with an optional unit, in
//!   any case and with or without a space: none or `B` (bytes), `KB`, `MB`, `GB`, `TB`
//!   (powers of 1000), `KiB`, `MiB`, `GiB`, `TiB` or `K`, `M`, `G`, `T` (powers of 1024):
//!   `1073741824`, `1GiB`, `512MiB`, `1.5GB`, `64 KiB`. A fraction of a byte is dropped.
//! - Leading and trailing spaces are ignored, and a variable that is set but empty (or only
//!   spaces) is the same as one that is not set: the default.
//! - Any other value, and any value that is not valid UTF-8, is an
//!   [`Error::InvalidEnvironment`] naming the variable, the value and the accepted forms,
//!   returned by the first operation that reads the variable (every later one that reads it
//!   too). Nothing is silently taken as the default.
//!
//! Each variable is read where its table entry's setting is first needed (most once per
//! process, the limit and the pool flags by each new pool).

use crate::error::{Error, Result};

/// What a flag accepts, as its error says.
pub const FLAG_FORMS: &str = "1, true, yes or on; 0, false, no or off (in any case)";

/// Reads `variable`: `None` when it is not set or is empty (after trimming spaces), else the
/// trimmed value.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] with `expected` for a value that is not valid UTF-8.
pub fn read(variable: &'static str, expected: &'static str) -> Result<Option<String>> {
    match std::env::var_os(variable) {
        None => Ok(None),
        Some(value) => match value.into_string() {
            Ok(text) => {
                let text = text.trim();
                Ok((!text.is_empty()).then(|| text.to_owned()))
            }
            Err(raw) => Err(Error::InvalidEnvironment {
                variable,
                value: raw.to_string_lossy().into_owned(),
                expected,
            }),
        },
    }
}

/// Reads and parses `variable` with `parse`, which gives `None` for a value it does not
/// accept: `Ok(None)` when the variable is not set (or empty).
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] with `expected` for a value `parse` refuses or that is not
/// valid UTF-8.
pub fn parse<T>(
    variable: &'static str,
    expected: &'static str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>> {
    let Some(value) = read(variable, expected)? else { return Ok(None) };
    match parse(&value) {
        Some(v) => Ok(Some(v)),
        None => Err(Error::InvalidEnvironment { variable, value, expected }),
    }
}

/// Reads an on/off `variable` ([`FLAG_FORMS`]): `None` when it is not set (or empty).
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value.
pub fn flag(variable: &'static str) -> Result<Option<bool>> {
    parse(variable, FLAG_FORMS, parse_flag)
}

/// A flag's value: `Some(true)` for `1`, `true`, `yes`, `on`, `Some(false)` for `0`, `false`,
/// `no`, `off` (in any case, spaces around ignored), `None` for anything else.
#[must_use]
pub fn parse_flag(text: &str) -> Option<bool> {
    let text = text.trim();
    let is = |word: &str| text.eq_ignore_ascii_case(word);
    if ["1", "true", "yes", "on"].into_iter().any(is) {
        Some(true)
    } else if ["0", "false", "no", "off"].into_iter().any(is) {
        Some(false)
    } else {
        None
    }
}

/// A byte size as the module docs describe it (`1GiB`, `512MiB`, `1.5GB`, `4096`); `None` for
/// anything else, or a size past `usize::MAX`.
#[must_use]
pub fn parse_byte_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let number_end = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let multiplier: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "mb" => 1000_u128.pow(2),
        "gb" => 1000_u128.pow(3),
        "tb" => 1000_u128.pow(4),
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // Digits only, at least one in all, and few enough that the arithmetic below cannot overflow
    // (a size in bytes has at most 20 digits; the fraction's beyond 12 are below a byte).
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !digits(whole) || !digits(fraction) || whole.len() > 20 {
        return None;
    }
    let fraction = &fraction[..fraction.len().min(12)];
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let scale = 10_u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() { 0 } else { fraction.parse().ok()? };
    let bytes = whole.checked_mul(multiplier)?.checked_add(fraction * multiplier / scale)?;
    usize::try_from(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_every_spelling_in_any_case_and_nothing_else() {
        for on in ["1", "true", "True", "TRUE", "yes", "Yes", "on", "ON", " on "] {
            assert_eq!(parse_flag(on), Some(true), "{on:?}");
        }
        for off in ["0", "false", "False", "no", "NO", "off", "Off"] {
            assert_eq!(parse_flag(off), Some(false), "{off:?}");
        }
        for bad in ["2", "y", "n", "enabled", "", "truth", "-1"] {
            assert_eq!(parse_flag(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn byte_sizes_take_decimal_and_binary_units_and_fractions() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("12b", 12),
            ("1GiB", 1 << 30),
            ("512MiB", 512 << 20),
            ("512 mib", 512 << 20),
            ("1.5GB", 1_500_000_000),
            ("1.5GiB", 3 << 29),
            ("8MB", 8_000_000),
            ("64K", 64 << 10),
            ("1g", 1 << 30),
            ("2TiB", 2 << 40),
            (".5KiB", 512),
            ("1.0001B", 1),
            ("18446744073709551615", usize::MAX),
        ] {
            assert_eq!(parse_byte_size(text), Some(bytes), "{text:?}");
        }
        for bad in
            ["", "GiB", "-1", "1.5.5GB", "1 GiB x", "lots", "1e9", "18446744073709551616", "20000000TiB", "."]
        {
            assert_eq!(parse_byte_size(bad), None, "{bad:?}");
        }
    }
}
