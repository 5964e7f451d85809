//! Pool limits: `set_limit` arguments and the `GPUMEM_GPU_MEMORY_LIMIT` variable.

use crate::error::{Error, Result};

/// The environment variable that sets each new pool's limit: a byte size (`1073741824`, `1GiB`,
/// `512MiB`, `1.5GB`; [the forms](crate::env)) or a percentage of the device's memory (`"40%"`,
/// `"70.5%"`). CuPy's `CUPY_GPU_MEMORY_LIMIT`, which takes bytes and percentages.
///
/// A malformed value is an `InvalidEnvironment` error from every allocation of a new pool until
/// the pool's own [`set_limit`](crate::SingleDeviceMemoryPool::set_limit) overrides it.
pub const LIMIT_ENV: &str = "GPUMEM_GPU_MEMORY_LIMIT";

/// What [`LIMIT_ENV`] accepts, as its error says.
const LIMIT_FORMS: &str = "a byte size (1073741824, 1GiB, 512MiB, 1.5GB) or a percentage of the device's memory from 0% to 100% (40%, 70.5%)";

/// A pool limit as given by the user.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// At most this many bytes held from the device; 0 means unlimited.
    Bytes(usize),
    /// At most this fraction (0 to 1) of the device's total memory; 0 means unlimited, as CuPy.
    Fraction(f64),
}

impl Limit {
    /// Parses a limit as [`LIMIT_ENV`] takes it: a trailing `%` gives a fraction (CuPy's
    /// `_parse_limit_string`), anything else a byte size with an optional unit.
    ///
    /// # Errors
    ///
    /// `InvalidEnvironment` naming [`LIMIT_ENV`], the text and the accepted forms when the text
    /// is neither, or the percentage is outside `0..=100`.
    pub fn parse(text: &str) -> Result<Limit> {
        Self::parse_text(text).ok_or_else(|| Error::InvalidEnvironment {
            variable: LIMIT_ENV,
            value: text.to_owned(),
            expected: LIMIT_FORMS,
        })
    }

    fn parse_text(text: &str) -> Option<Limit> {
        let text = text.trim();
        let limit = match text.strip_suffix('%') {
            Some(percent) => Limit::Fraction(percent.trim().parse::<f64>().ok()? / 100.0),
            None => Limit::Bytes(crate::env::parse_byte_size(text)?),
        };
        limit.validate().is_ok().then_some(limit)
    }

    /// Reads [`LIMIT_ENV`]; `None` when it is not set (or empty).
    ///
    /// # Errors
    ///
    /// As [`Limit::parse`]; a value that is not valid UTF-8 is refused the same way.
    pub fn from_env() -> Result<Option<Limit>> {
        crate::env::parse(LIMIT_ENV, LIMIT_FORMS, Self::parse_text)
    }

    pub(crate) fn validate(self) -> Result<()> {
        match self {
            Limit::Fraction(f) if !(0.0..=1.0).contains(&f) => {
                Err(Error::InvalidArgument(format!("memory limit fraction out of range: {f}")))
            }
            _ => Ok(()),
        }
    }

    /// The limit in bytes for a device of `total` bytes (the fraction truncated, as CuPy's
    /// `size_t` conversion).
    pub(crate) fn bytes(self, total: usize) -> usize {
        match self {
            Limit::Bytes(b) => b,
            Limit::Fraction(f) => (f * total as f64) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cupy_examples() {
        assert_eq!(Limit::parse("40%").unwrap(), Limit::Fraction(0.4));
        assert_eq!(Limit::parse("70.5%").unwrap(), Limit::Fraction(0.705));
        assert_eq!(Limit::parse("100%").unwrap(), Limit::Fraction(1.0));
        assert_eq!(Limit::parse("0").unwrap(), Limit::Bytes(0));
        assert_eq!(Limit::parse("1073741824").unwrap(), Limit::Bytes(1 << 30));
        assert_eq!(Limit::parse("1GiB").unwrap(), Limit::Bytes(1 << 30));
        assert_eq!(Limit::parse("512MiB").unwrap(), Limit::Bytes(512 << 20));
        assert_eq!(Limit::parse("1.5GB").unwrap(), Limit::Bytes(1_500_000_000));
        assert!(Limit::parse("lots").is_err());
        assert!(Limit::parse("-5").is_err());
        assert!(Limit::parse("nan%").is_err());
    }

    /// EV05: one error kind for every malformed limit, naming the variable, the value and the
    /// accepted forms.
    #[test]
    fn a_malformed_limit_names_the_variable_the_value_and_the_forms() {
        for bad in ["150%", "lots", "-5", "1 GiB x", "%"] {
            match Limit::parse(bad) {
                Err(Error::InvalidEnvironment { variable, value, expected }) => {
                    assert_eq!((variable, value.as_str(), expected), (LIMIT_ENV, bad, LIMIT_FORMS));
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert_eq!(
            Limit::parse("150%").unwrap_err().to_string(),
            format!("GPUMEM_GPU_MEMORY_LIMIT=\"150%\" is not valid: {LIMIT_FORMS}")
        );
    }

    #[test]
    fn fraction_truncates() {
        assert_eq!(Limit::Fraction(0.5).bytes(1001), 500);
        assert_eq!(Limit::Fraction(0.0).bytes(1 << 40), 0);
    }
}
