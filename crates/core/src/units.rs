//! Sizes and counts for people: one formatter for every byte size mslc prints (binary units,
//! three significant digits, so neither `666106.6 MiB` nor `0.0 MiB` appears) and one for
//! large counts such as parameters (`6.74 B`).

/// `bytes` in binary units with three significant digits: `512 B`, `748 KiB`, `14.0 MiB`,
/// `1.50 GiB`, `1.27 TiB`; beyond TiB the number grows (`2048 TiB`).
pub fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    three_digits(bytes as f64, 1024.0, &["KiB", "MiB", "GiB", "TiB"])
}

/// A count in decimal units with three significant digits: `999`, `12.3 K`, `6.74 B`
/// (billions, as model sizes are quoted), `1.20 T`; `u128::MAX`, where exact counts saturate,
/// reads `more than 10^38`.
pub fn human_count(n: u128) -> String {
    if n == u128::MAX {
        return "more than 10^38".to_string();
    }
    if n < 1000 {
        return n.to_string();
    }
    three_digits(n as f64, 1000.0, &["K", "M", "B", "T"])
}

/// `value` divided by `base` until it fits the largest fitting unit, with three significant
/// digits; a value that would round up to `base` moves to the next unit (`1.00 MiB`, not
/// `1024 KiB`).
fn three_digits(value: f64, base: f64, units: &[&str]) -> String {
    let mut value = value / base;
    let mut unit = 0;
    while value >= base - 0.5 && unit + 1 < units.len() {
        value /= base;
        unit += 1;
    }
    let name = units[unit];
    if value < 9.995 {
        format!("{value:.2} {name}")
    } else if value < 99.95 {
        format!("{value:.1} {name}")
    } else {
        format!("{value:.0} {name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_the_unit_that_reads_best() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(765_000), "747 KiB");
        assert_eq!(human_bytes(14 << 20), "14.0 MiB");
        assert_eq!(human_bytes((1 << 20) - 1), "1.00 MiB");
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes(666_106 << 20), "650 GiB");
        assert_eq!(human_bytes(1_400_000_000_000), "1.27 TiB");
        assert_eq!(human_bytes(u64::MAX), "16777216 TiB");
    }

    #[test]
    fn counts_use_decimal_units() {
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(12_345), "12.3 K");
        assert_eq!(human_count(6_738_415_616), "6.74 B");
        assert_eq!(human_count(3_676_416), "3.68 M");
        assert_eq!(human_count(u128::MAX), "more than 10^38");
    }
}
