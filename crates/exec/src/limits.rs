//! How much memory this process may still take: what the kernel reports as available, lowered
//! by the control group's limit when there is one. The executor compares its plan with this
//! before allocating, so a model too big for the machine is a clear error, not the OOM killer.

use std::path::Path;

use mslc_core::units::human_bytes;

/// Bytes this process can allocate now: `MemAvailable` from `/proc/meminfo`, or less when a
/// cgroup (v2 or v1) memory limit leaves less room. `None` where neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text));
    let cgroup = cgroup_room(Path::new("/sys/fs/cgroup"));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Blocks of at least this many bytes go straight to the system and back
/// ([`return_large_blocks`]): glibc's default before it adapts.
const LARGE_BLOCK: usize = 128 * 1024;

/// Makes the allocator take every block of [`LARGE_BLOCK`] bytes or more from the system and
/// give it back when it is freed. glibc's threshold for that otherwise rises to the largest
/// block freed so far (up to 32 MiB), after which the activations a pipeline stage receives,
/// stashes and frees stay resident in each thread's heap: a run's resident memory then follows
/// what its memory plan allocates. (glibc only; the executor's own buffers are allocated once.)
pub fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets an allocator parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BLOCK as libc::c_int);
    }
}

/// Where a measurement of this process's peak memory started: the resident set then, and its
/// file-backed part (mapped code and files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RssMark {
    rss: u64,
    file: u64,
}

/// Starts a measurement of this process's peak memory: resets the kernel's high-water mark of
/// the resident set (`/proc/self/clear_refs`, Linux 4.0+) to the current resident set. `None`
/// where that cannot be done (then no measurement is made).
pub fn reset_peak_rss() -> Option<RssMark> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    Some(RssMark {
        rss: status_bytes("VmRSS:")?,
        file: status_bytes("RssFile:")?,
    })
}

/// How far the resident set rose above `mark` at its highest since then (`VmHWM`), less the
/// file-backed pages it gained (the executable's code paged in as new kernels run: not memory
/// a plan holds), bytes.
pub fn peak_rss_since(mark: RssMark) -> Option<u64> {
    let (peak, file) = (status_bytes("VmHWM:")?, status_bytes("RssFile:")?);
    Some(
        peak.saturating_sub(mark.rss)
            .saturating_sub(file.saturating_sub(mark.file)),
    )
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&text, field)
}

/// The value of a `NAME: N kB` line of a `/proc` text, in bytes.
fn kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find_map(|l| l.strip_prefix(field))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    kib_field(meminfo, "MemAvailable:")
}

/// Limit minus usage of the cgroup mounted at `root` (v2 `memory.max`/`memory.current`, else
/// v1 `memory/memory.limit_in_bytes`/`memory.usage_in_bytes`); `None` when unlimited or absent.
fn cgroup_room(root: &Path) -> Option<u64> {
    let read = |file: &str| -> Option<u64> {
        std::fs::read_to_string(root.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let (limit, usage) = match read("memory.max") {
        Some(limit) => (limit, read("memory.current")?),
        None => (
            read("memory/memory.limit_in_bytes")?,
            read("memory/memory.usage_in_bytes")?,
        ),
    };
    // v1 reports "no limit" as a huge page-rounded number.
    (limit < 1 << 60).then(|| limit.saturating_sub(usage))
}

/// Parses a size such as `512MB`, `16GiB`, `1.5G` or `1000000` (bytes): `KB`/`MB`/`GB`/`TB` are
/// powers of 1000; `K`/`M`/`G`/`T` and `KiB`/`MiB`/`GiB`/`TiB` powers of 1024; a trailing `B`
/// alone means bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`; use B, KB, MB, GB, TB or KiB, MiB, GiB, TiB"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 512MB or 16GiB"))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(bytes as u64)
}

/// [`human_bytes`] with the exact count when it is rounded: `1.50 GiB = 1610612736 bytes`.
pub fn exact_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        human_bytes(bytes)
    } else {
        format!("{} = {bytes} bytes", human_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2 K"), Ok(2048));
        for bad in ["", "MB", "12XB", "1e400GB", "-1", "99999999999999999999TB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    /// Touching 64 MiB after a reset raises the high-water mark by about that much.
    #[test]
    fn the_peak_resident_set_is_measured_from_a_reset() {
        let Some(mark) = reset_peak_rss() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "no /proc/self/clear_refs under CI"
            );
            return;
        };
        let mut block = vec![0u8; 64 << 20];
        for page in block.chunks_mut(4096) {
            page[0] = 1;
        }
        std::hint::black_box(&block);
        let grown = peak_rss_since(mark).unwrap();
        assert!(grown >= 60 << 20, "grew {grown} bytes");
    }

    #[test]
    fn meminfo_and_cgroup_files_are_read() {
        let text = "MemTotal:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(text), Some(2 << 20));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_room(dir.path()), None);
        std::fs::write(dir.path().join("memory.max"), "1000\n").unwrap();
        std::fs::write(dir.path().join("memory.current"), "400\n").unwrap();
        assert_eq!(cgroup_room(dir.path()), Some(600));
        assert!(available_memory().is_some());
    }

    #[test]
    fn byte_counts_read_well() {
        assert_eq!(exact_bytes(3 << 29), "1.50 GiB = 1610612736 bytes");
        assert_eq!(exact_bytes(0), "0 B");
    }
}
