//! The tuning budget: `60s`, `2m`, `1h`, `500ms` or plain seconds, within sane limits.

use std::time::Duration;

/// The longest budget accepted: a day.
pub const MAX_BUDGET: Duration = Duration::from_secs(24 * 3600);

/// Reads a budget; an error says why it is not one (unparsable, zero or over a day).
pub fn parse_budget(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (write e.g. `60s`, `5m`, `1h`)"))?;
    let scale = match unit.trim() {
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
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!(
            "a budget of `{text}` leaves no time to measure anything; give at least 1s"
        ));
    }
    if seconds > MAX_BUDGET.as_secs_f64() {
        return Err(format!(
            "a budget of `{text}` is over the limit of 24h; tuning converges in minutes, give less"
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
        assert_eq!(parse_budget("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["0", "0s", "3d", "soon", "5 parsecs", "-1s"] {
            assert!(parse_budget(bad).is_err(), "{bad}");
        }
        assert!(parse_budget("0s").unwrap_err().contains("no time"));
        assert!(parse_budget("3d").unwrap_err().contains("24h"));
    }
}
