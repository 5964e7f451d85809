//! The growth policies' names: one spelling (`hold_peak_in_use`) for Rust's `Display`, the
//! `gpumem-trace` command line, the C ABI and Python. `FromStr` also takes the other spellings a
//! user may write (`hold-peak-in-use`, `HoldPeakInUse`, any case), so none of them is an error.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;

use crate::error::Error;
use crate::pool::GrowthPolicy;

impl GrowthPolicy {
    /// Every growth policy, in declaration order.
    pub const ALL: [GrowthPolicy; 4] = [
        GrowthPolicy::CacheUntilOutOfMemory,
        GrowthPolicy::ReleaseBeforeGrow,
        GrowthPolicy::HoldPeakInUse,
        GrowthPolicy::Segments,
    ];

    /// The policy's name, NUL-terminated for the C ABI: `c"hold_peak_in_use"`.
    #[must_use]
    pub const fn c_name(self) -> &'static CStr {
        // Exhaustive, so a new policy does not build until it has a name (and a place in ALL).
        match self {
            GrowthPolicy::CacheUntilOutOfMemory => c"cache_until_out_of_memory",
            GrowthPolicy::ReleaseBeforeGrow => c"release_before_grow",
            GrowthPolicy::HoldPeakInUse => c"hold_peak_in_use",
            GrowthPolicy::Segments => c"segments",
        }
    }

    /// The policy's name: `"hold_peak_in_use"` (what `Display` writes).
    #[must_use]
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("the names are ASCII")
    }
}

/// Writes the policy's name, `hold_peak_in_use`.
impl fmt::Display for GrowthPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads a policy's name in any of its spellings: `hold_peak_in_use`, `hold-peak-in-use`,
/// `HoldPeakInUse`, in any case.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming the text and listing the policies.
impl FromStr for GrowthPolicy {
    type Err = Error;

    fn from_str(text: &str) -> Result<GrowthPolicy, Error> {
        let letters = |s: &str| -> String {
            s.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
        };
        let wanted = letters(text);
        GrowthPolicy::ALL.into_iter().find(|p| letters(p.name()) == wanted).ok_or_else(|| {
            let names: Vec<&str> = GrowthPolicy::ALL.iter().map(|p| p.name()).collect();
            Error::InvalidArgument(format!(
                "unknown growth policy {text:?}; the policies are {}",
                names.join(", ")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_reads_back_and_display_writes_one() {
        for policy in GrowthPolicy::ALL {
            let name = policy.to_string();
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
            assert_eq!(name.parse::<GrowthPolicy>().unwrap(), policy);
            assert_eq!(name.replace('_', "-").parse::<GrowthPolicy>().unwrap(), policy);
            assert_eq!(format!("{policy:?}").parse::<GrowthPolicy>().unwrap(), policy);
            assert_eq!(name.to_uppercase().parse::<GrowthPolicy>().unwrap(), policy);
        }
        let e = "largest_first".parse::<GrowthPolicy>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid argument: unknown growth policy \"largest_first\"; the policies are \
             cache_until_out_of_memory, release_before_grow, hold_peak_in_use, segments"
        );
        assert!("".parse::<GrowthPolicy>().is_err());
    }
}
