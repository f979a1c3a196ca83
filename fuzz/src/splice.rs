//! Grammar-aware mutation for the `check` target: instead of flipping bytes (which mostly
//! yields syntax errors on the first token), splice whole lines and tokens of real sources —
//! the examples and the standard library — into the input, so mutants stay close enough to
//! the grammar to reach the checker.

use std::sync::OnceLock;

/// The sources lines and tokens are taken from.
const SEEDS: &[&str] = &[
    include_str!("../../examples/mlp.msl"),
    include_str!("../../examples/tiny_llama.msl"),
    include_str!("../../examples/bert_base.msl"),
    include_str!("../../examples/resnet50.msl"),
    include_str!("../../examples/llama2_70b.msl"),
    include_str!("../../stdlib/nn.msl"),
    include_str!("../../stdlib/llm.msl"),
    include_str!("../../stdlib/precision.msl"),
    include_str!("../../stdlib/targets.msl"),
];

/// Tokens the seeds may lack, at the edges of what the checker accepts.
const EXTRA_TOKENS: &[&str] = &[
    "0",
    "-1",
    "9223372036854775807",
    "1e308",
    "0.0",
    "1000000000",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    "...",
    "_",
    "**",
    "|>",
    "@",
    "~",
    "..",
    "\"",
    "/*",
    "*/",
    "//",
    "\t",
    "\u{feff}",
];

fn lines() -> &'static [&'static str] {
    static LINES: OnceLock<Vec<&'static str>> = OnceLock::new();
    LINES.get_or_init(|| {
        SEEDS
            .iter()
            .flat_map(|s| s.lines())
            .filter(|l| !l.trim().is_empty())
            .collect()
    })
}

fn tokens() -> &'static [&'static str] {
    static TOKENS: OnceLock<Vec<&'static str>> = OnceLock::new();
    TOKENS.get_or_init(|| {
        let mut tokens: Vec<&str> = SEEDS.iter().flat_map(|s| s.split_whitespace()).collect();
        tokens.extend_from_slice(EXTRA_TOKENS);
        tokens
    })
}

/// A small deterministic generator (xorshift), seeded by libFuzzer.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// One mutation of `data` (taken as text): insert, replace, delete or duplicate a line, or
/// insert or replace a token.
pub fn mutate(data: &[u8], seed: u32) -> Vec<u8> {
    let mut rng = Rng(u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let text = String::from_utf8_lossy(data);
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    let at = rng.below(lines.len());
    match rng.below(6) {
        0 => lines.insert(at, rng.pick(self::lines()).to_string()),
        1 => lines[at] = rng.pick(self::lines()).to_string(),
        2 if lines.len() > 1 => {
            lines.remove(at);
        }
        3 => {
            let copy = lines[at].clone();
            lines.insert(rng.below(lines.len() + 1), copy);
        }
        4 => {
            let line = &mut lines[at];
            let cuts: Vec<usize> = line
                .char_indices()
                .map(|(i, _)| i)
                .chain([line.len()])
                .collect();
            let cut = cuts[rng.below(cuts.len())];
            line.insert_str(cut, &format!(" {} ", rng.pick(tokens())));
        }
        _ => {
            let mut words: Vec<&str> = lines[at].split(' ').collect();
            let i = rng.below(words.len());
            words[i] = rng.pick(tokens());
            lines[at] = words.join(" ");
        }
    }
    lines.join("\n").into_bytes()
}
