//! The tuning budget: `60s`, `2m`, `1h`, `1.5s` or plain seconds, within sane limits.

use std::time::Duration;

/// The shortest budget accepted: less measures no kernel candidate with its warm-up and
/// repeated timings, and would only report every signature skipped.
pub const MIN_BUDGET: Duration = Duration::from_secs(1);

/// The longest budget accepted: a day.
pub const MAX_BUDGET: Duration = Duration::from_secs(24 * 3600);

/// Reads a budget; an error says why it is not one (unparsable, under a second or over a
/// day).
pub fn parse_budget(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    // The unit is the trailing run of letters; what precedes it is the number, in any form
    // Rust reads a float in (`90`, `1.5`, `2e3`).
    let split = t.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len();
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (write e.g. `60s`, `5m`, `1h`)"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use ms, s, m, h or d)"
            ))
        }
    };
    let seconds = value * scale;
    if seconds > MAX_BUDGET.as_secs_f64() {
        return Err(format!(
            "a budget of `{text}` is over the limit of {}h; tuning converges in minutes, give less",
            MAX_BUDGET.as_secs() / 3600
        ));
    }
    if seconds.is_nan() || seconds < MIN_BUDGET.as_secs_f64() {
        return Err(format!(
            "a budget of `{text}` leaves no time to measure a kernel candidate; give at least {}s",
            MIN_BUDGET.as_secs()
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_with_units_and_limits() {
        assert_eq!(parse_budget("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_budget("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_budget("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_budget("2500ms"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_budget("1e2 s"), Ok(Duration::from_secs(100)));
        assert_eq!(parse_budget("1s"), Ok(MIN_BUDGET));
        assert_eq!(parse_budget("24h"), Ok(MAX_BUDGET));
        for bad in [
            "", "s", "inf", "0", "0s", "250ms", "-1s", "3d", "1e309s", "soon",
        ] {
            assert!(parse_budget(bad).is_err(), "{bad}");
        }
        for short in ["0s", "250ms", "-1s", "0.5"] {
            assert!(
                parse_budget(short).unwrap_err().contains("at least 1s"),
                "{short}"
            );
        }
        for long in ["3d", "1e309s", "25h"] {
            assert!(parse_budget(long).unwrap_err().contains("24h"), "{long}");
        }
        assert!(parse_budget("5 parsecs")
            .unwrap_err()
            .contains("unknown unit `parsecs`"));
        assert!(parse_budget("soon").unwrap_err().contains("not a duration"));
    }
}
