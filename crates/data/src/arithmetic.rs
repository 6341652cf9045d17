//! Synthetic arithmetic word problems with GSM8K-style answers, generated from `(seed, index)`.
//!
//! Example `index` is drawn from a SplitMix64 stream keyed by `(seed, index, attempt)`: no state
//! is carried between examples, so any index is O(1) and the stream is the same on every host.
//!
//! **Train and held-out never share a problem.** A problem (operation and operands, whatever the
//! phrasing) belongs to the held-out split when a seed-independent hash of it falls in one eighth
//! of the hash space; each split's generator redraws until it gets a problem of its own split. So
//! the splits are disjoint by construction, for every seed and every pair of seeds.

use crate::config::ArithmeticConfig;
use crate::rng::{CounterRng, hash_words};
use crate::source::{Example, ExampleSource};
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Domain tag of the problem streams.
const DOMAIN_PROBLEM: u64 = 0x6172_6974_685f_7072; // "arith_pr"
/// Domain tag of the split hash. Deliberately not mixed with the seed: a problem's split is a
/// property of the problem, so no two seeds can leak held-out problems into training.
const DOMAIN_SPLIT: u64 = 0x6172_6974_685f_7370; // "arith_sp"
/// One problem in `HELD_OUT_ONE_IN` is held out: those whose split hash is in the lowest
/// `1 / HELD_OUT_ONE_IN` of the hash space.
const HELD_OUT_ONE_IN: u64 = 8;
/// Draws before giving up on finding a problem of the requested split: with a one-in-eight split
/// the chance of a spurious failure is (7/8)^4096, i.e. never, unless the configured problem
/// space really has no problem of that split.
const MAX_DRAWS: u32 = 4096;

/// An arithmetic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `a + b`.
    Add,
    /// `a - b` with `a >= b`, so results are never negative.
    Sub,
    /// `a * b` with `b` a small multiplier (`2..=max_multiplier`).
    Mul,
}

impl Op {
    fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
            Op::Mul => '*',
        }
    }

    fn templates(self) -> &'static [&'static str] {
        match self {
            Op::Add => ADD_TEMPLATES,
            Op::Sub => SUB_TEMPLATES,
            Op::Mul => MUL_TEMPLATES,
        }
    }
}

/// Which of the two disjoint problem sets a stream draws from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Seven eighths of all problems.
    #[default]
    Train,
    /// The other eighth, for evaluation.
    HeldOut,
}

impl Split {
    /// The split's name in configs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::HeldOut => "held_out",
        }
    }
}

/// The mathematical content of a word problem, without its phrasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Problem {
    /// The operation.
    pub op: Op,
    /// Left operand (for `Sub`, the larger one; for `Mul`, the multi-digit one).
    pub a: u64,
    /// Right operand (for `Mul`, the small multiplier).
    pub b: u64,
}

impl Problem {
    /// The exact result (operands are bounded so it cannot overflow).
    pub fn result(&self) -> u64 {
        match self.op {
            Op::Add => self.a + self.b,
            Op::Sub => self.a - self.b,
            Op::Mul => self.a * self.b,
        }
    }

    /// The split this problem belongs to, whatever the seed.
    pub fn split(&self) -> Split {
        let op = self.op as u64;
        if hash_words(&[DOMAIN_SPLIT, op, self.a, self.b]) < u64::MAX / HELD_OUT_ONE_IN {
            Split::HeldOut
        } else {
            Split::Train
        }
    }

    /// The worked line and the final answer, e.g. `47 + 85 = 132\n#### 132`.
    pub fn answer(&self) -> String {
        let result = self.result();
        format!("{} {} {} = {result}\n#### {result}", self.a, self.op.symbol(), self.b)
    }
}

/// An endless stream of word problems of one split. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arithmetic {
    seed: u64,
    split: Split,
    min_digits: u32,
    max_digits: u32,
    ops: Vec<Op>,
    max_multiplier: u64,
}

impl Arithmetic {
    /// The stream `config` describes (including its split) for `seed`.
    pub fn new(config: &ArithmeticConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            seed,
            split: config.split,
            min_digits: config.digits[0],
            max_digits: config.digits[1],
            ops: config.ops.clone(),
            max_multiplier: u64::from(config.max_multiplier),
        })
    }

    /// The split this stream draws from.
    pub fn split(&self) -> Split {
        self.split
    }

    /// The problem at `index`, and the stream that picks its phrasing.
    fn draw(&self, index: u64) -> Result<(Problem, CounterRng)> {
        for attempt in 0..MAX_DRAWS {
            let mut rng = CounterRng::new(&[DOMAIN_PROBLEM, self.seed, index, u64::from(attempt)]);
            let op = self.ops[rng.below(self.ops.len() as u64) as usize];
            let a = self.operand(&mut rng);
            let problem = match op {
                Op::Add => Problem { op, a, b: self.operand(&mut rng) },
                Op::Sub => {
                    let b = self.operand(&mut rng);
                    Problem { op, a: a.max(b), b: a.min(b) }
                }
                Op::Mul => Problem { op, a, b: rng.in_range(2, self.max_multiplier) },
            };
            if problem.split() == self.split {
                return Ok((problem, rng));
            }
        }
        Err(DataError::ProblemSpaceExhausted { split: self.split.name(), index, draws: MAX_DRAWS })
    }

    /// The problem at `index` (what [`ExampleSource::example`] phrases).
    pub fn problem(&self, index: u64) -> Result<Problem> {
        self.draw(index).map(|(problem, _)| problem)
    }

    /// An operand with a uniformly drawn digit count. One-digit operands start at 2 so that
    /// every count in a prompt reads as a plural.
    fn operand(&self, rng: &mut CounterRng) -> u64 {
        let digits = rng.in_range(u64::from(self.min_digits), u64::from(self.max_digits)) as u32;
        let low = if digits == 1 { 2 } else { 10u64.pow(digits - 1) };
        rng.in_range(low, 10u64.pow(digits) - 1)
    }
}

impl ExampleSource for Arithmetic {
    fn num_examples(&self) -> Option<u64> {
        None
    }

    fn example(&self, index: u64) -> Result<Example> {
        let (problem, mut rng) = self.draw(index)?;
        let templates = problem.op.templates();
        let template = templates[rng.below(templates.len() as u64) as usize];
        let person = rng.below(NAMES.len() as u64) as usize;
        // A second, different person: draw among the others.
        let other = (person + 1 + rng.below(NAMES.len() as u64 - 1) as usize) % NAMES.len();
        let object = OBJECTS[rng.below(OBJECTS.len() as u64) as usize];
        let prompt = render(template, NAMES[person], NAMES[other], object, &problem);
        Ok(Example::text(prompt, problem.answer()))
    }
}

/// Fills a template's placeholders (see below) and ends the prompt with a newline.
fn render(template: &str, person: &str, other: &str, object: &str, problem: &Problem) -> String {
    let mut prompt = String::with_capacity(template.len() + 32);
    let mut chars = template.chars();
    while let Some(ch) = chars.next() {
        if ch != '{' {
            prompt.push(ch);
            continue;
        }
        // Templates are constants checked by a test: every `{` opens a one-letter key.
        let key = chars.next();
        chars.next();
        // Writing to a String cannot fail.
        let _ = match key {
            Some('p') => write!(prompt, "{person}"),
            Some('q') => write!(prompt, "{other}"),
            Some('a') => write!(prompt, "{}", problem.a),
            Some('b') => write!(prompt, "{}", problem.b),
            _ => write!(prompt, "{object}"),
        };
    }
    prompt.push('\n');
    prompt
}

/// People in the problems.
const NAMES: &[&str] = &[
    "Ann", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jack", "Kemi", "Liam", "Maya",
    "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara",
];

/// Things being counted, as plurals.
const OBJECTS: &[&str] = &[
    "marbles", "apples", "stickers", "pencils", "books", "cookies", "stamps", "coins", "shells", "cards",
    "balloons", "buttons", "beads", "crayons", "oranges", "toy cars",
];

// Placeholders: {p} a person, {q} another person, {a} and {b} the operands, {o} the objects.

/// Addition phrasings: buy, receive, collect, combine.
const ADD_TEMPLATES: &[&str] = &[
    "{p} has {a} {o} and buys {b} more. How many {o} does {p} have now?",
    "{p} has {a} {o}. {q} gives {p} {b} more. How many {o} does {p} have now?",
    "{p} collected {a} {o} on Monday and {b} on Tuesday. How many {o} did {p} collect?",
    "There are {a} {o} in a box and {b} {o} in a bag. How many {o} are there altogether?",
    "{p} found {a} {o} and {q} found {b} {o}. How many {o} did they find together?",
    "A shop sold {a} {o} before noon and {b} after noon. How many {o} did it sell?",
    "{p} had {a} {o} and won {b} more in a game. How many {o} does {p} have now?",
    "A library has {a} {o} and receives {b} more. How many {o} does the library have now?",
    "{p} counted {a} red {o} and {b} blue {o}. How many {o} did {p} count?",
    "{q} has {a} {o}. {p} has {b} more {o} than {q}. How many {o} does {p} have?",
    "{p} packed {a} {o} and then packed {b} more. How many {o} did {p} pack?",
];

/// Subtraction phrasings: give, lose, share, sell, compare.
const SUB_TEMPLATES: &[&str] = &[
    "{p} has {a} {o} and gives {b} of them to {q}. How many {o} does {p} have left?",
    "{p} had {a} {o} and lost {b} of them. How many {o} does {p} have now?",
    "{p} has {a} {o} and shares {b} of them with {q}. How many {o} does {p} keep?",
    "A box holds {a} {o}. {p} takes out {b} {o}. How many {o} are left in the box?",
    "{p} needs {a} {o} and already has {b}. How many more {o} does {p} need?",
    "{p} has {a} {o} and {q} has {b}. How many more {o} does {p} have than {q}?",
    "A shop had {a} {o} and sold {b} of them. How many {o} does the shop have left?",
    "{p} bought {a} {o} and used {b} of them. How many {o} are unused?",
    "There were {a} {o} on a shelf. {p} took {b} of them. How many {o} are on the shelf now?",
    "{p} wants to collect {a} {o} and has {b} so far. How many {o} are still missing?",
    "{p} had {a} {o}. After giving {b} {o} to {q}, how many {o} does {p} have?",
];

/// Multiplication phrasings: {b} is the small multiplier.
const MUL_TEMPLATES: &[&str] = &[
    "{p} buys {b} packs of {o}. Each pack has {a} {o}. How many {o} does {p} buy?",
    "There are {b} boxes with {a} {o} in each box. How many {o} are there in all?",
    "{p} has {a} {o} and {q} has {b} times as many. How many {o} does {q} have?",
    "Each of {b} friends brings {a} {o} to a party. How many {o} are at the party?",
    "{p} collects {a} {o} every day for {b} days. How many {o} does {p} collect?",
    "A shelf has {b} rows with {a} {o} in each row. How many {o} are on the shelf?",
    "{p} gives {a} {o} to each of {b} classmates. How many {o} does {p} give away?",
    "A crate holds {a} {o}. How many {o} are in {b} crates?",
    "{p} sells {a} {o} each week. How many {o} does {p} sell in {b} weeks?",
    "{p} has {b} bags, and each bag holds {a} {o}. How many {o} does {p} have?",
    "{q} shares out {b} bags of {a} {o} each. How many {o} does {q} share out?",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{CharTokenizer, Tokenizer};
    use std::collections::HashSet;

    fn stream(split: Split, seed: u64) -> Arithmetic {
        Arithmetic::new(&ArithmeticConfig { split, ..ArithmeticConfig::default() }, seed)
            .expect("valid config")
    }

    #[test]
    fn templates_use_only_known_placeholders_and_every_operand() {
        for op in [Op::Add, Op::Sub, Op::Mul] {
            for template in op.templates() {
                let mut keys = Vec::new();
                let mut chars = template.chars();
                while let Some(ch) = chars.next() {
                    if ch == '{' {
                        let key = chars.next().expect("key");
                        assert_eq!(chars.next(), Some('}'), "{template}");
                        assert!("pqabo".contains(key), "{template}: {{{key}}}");
                        keys.push(key);
                    }
                    assert_ne!(ch, '}', "{template}");
                }
                assert_eq!(keys.iter().filter(|&&k| k == 'a').count(), 1, "{template}");
                assert_eq!(keys.iter().filter(|&&k| k == 'b').count(), 1, "{template}");
                assert!(keys.contains(&'o'), "{template}");
            }
        }
        let total: usize = [Op::Add, Op::Sub, Op::Mul].iter().map(|op| op.templates().len()).sum();
        assert!(total >= 30, "a few dozen phrasings, got {total}");
    }

    #[test]
    fn default_difficulty_fits_a_128_token_row() {
        // The worst case: longest names and objects, largest 3-digit operands. With BOS and EOS
        // it must fit seq_len + 1 = 129 tokens, so the tiny model's rows are never truncated.
        let longest = |words: &[&'static str]| *words.iter().max_by_key(|w| w.len()).expect("non-empty");
        let (name, object) = (longest(NAMES), longest(OBJECTS));
        for op in [Op::Add, Op::Sub, Op::Mul] {
            let problem = Problem { op, a: 999, b: if op == Op::Mul { 9 } else { 999 } };
            for template in op.templates() {
                let prompt = render(template, name, name, object, &problem);
                let tokens = CharTokenizer.encode(&prompt).expect("ascii").len()
                    + CharTokenizer.encode(&problem.answer()).expect("ascii").len()
                    + 2;
                assert!(tokens <= 129, "{tokens} tokens: {prompt:?}");
            }
        }
    }

    #[test]
    fn example_answer_is_the_worked_line_and_the_final_number() {
        let source = stream(Split::Train, 1);
        for index in 0..500 {
            let example = source.example(index).expect("example");
            let problem = source.problem(index).expect("problem");
            let result = problem.result();
            let prompt = example.prompt.display();
            assert!(prompt.ends_with("?\n"), "{prompt:?}");
            assert!(prompt.contains(&problem.a.to_string()), "{example:?}");
            assert!(prompt.contains(&problem.b.to_string()), "{example:?}");
            assert!(example.answer.ends_with(&format!("= {result}\n#### {result}")), "{example:?}");
            assert!(!prompt.contains('{') && !prompt.contains('}'), "{example:?}");
            // Everything the stream produces fits the character tokenizer.
            CharTokenizer.encode(&prompt).expect("ascii prompt");
            CharTokenizer.encode(&example.answer).expect("ascii answer");
        }
    }

    #[test]
    fn operands_respect_digits_ops_and_multiplier() {
        let config = ArithmeticConfig {
            digits: [3, 4],
            ops: vec![Op::Sub, Op::Mul],
            max_multiplier: 5,
            ..Default::default()
        };
        let source = Arithmetic::new(&config, 3).expect("valid");
        let mut ops_seen = HashSet::new();
        for index in 0..2000 {
            let problem = source.problem(index).expect("problem");
            ops_seen.insert(problem.op);
            assert!((100..=9999).contains(&problem.a), "{problem:?}");
            match problem.op {
                Op::Sub => assert!((100..=problem.a).contains(&problem.b), "{problem:?}"),
                Op::Mul => assert!((2..=5).contains(&problem.b), "{problem:?}"),
                Op::Add => panic!("add was not configured: {problem:?}"),
            }
        }
        assert_eq!(ops_seen.len(), 2);
    }

    #[test]
    fn one_digit_problems_work_for_both_splits() {
        let config = ArithmeticConfig { digits: [1, 1], ..Default::default() };
        for split in [Split::Train, Split::HeldOut] {
            let source = Arithmetic::new(&ArithmeticConfig { split, ..config.clone() }, 0).expect("valid");
            for index in 0..200 {
                let problem = source.problem(index).expect("problem");
                assert!((2..=9).contains(&problem.a), "{problem:?}");
                assert_eq!(problem.split(), split);
            }
        }
    }

    #[test]
    fn same_seed_and_index_give_the_same_example_and_seeds_differ() {
        let (first, again, other) =
            (stream(Split::Train, 11), stream(Split::Train, 11), stream(Split::Train, 12));
        let a: Vec<Example> = (0..100).map(|i| first.example(i).expect("example")).collect();
        let b: Vec<Example> = (0..100).rev().map(|i| again.example(i).expect("example")).rev().collect();
        let c: Vec<Example> = (0..100).map(|i| other.example(i).expect("example")).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn train_and_held_out_never_share_a_problem() {
        let train: HashSet<Problem> =
            (0..5000).map(|i| stream(Split::Train, 1).problem(i).expect("train")).collect();
        // Held-out from several seeds, including the train seed.
        for seed in [1, 2, 3] {
            let held_out = stream(Split::HeldOut, seed);
            for index in 0..2000 {
                let problem = held_out.problem(index).expect("held out");
                assert_eq!(problem.split(), Split::HeldOut);
                assert!(!train.contains(&problem), "seed {seed} index {index}: {problem:?} is in train");
            }
        }
        // The split is about an eighth of the problem space, not a sliver.
        let all: Vec<Problem> =
            (0..4000u64).map(|a| Problem { op: Op::Add, a: 100 + a % 900, b: 10 + a / 900 }).collect();
        let held_out = all.iter().filter(|p| p.split() == Split::HeldOut).count();
        assert!((350..650).contains(&held_out), "{held_out} of 4000 held out");
    }

    #[test]
    fn a_split_with_no_problems_is_an_error_not_a_hang() {
        // 1-digit multiplication by 2..=m has only 8 * (m - 1) problems; find the smallest m
        // whose held-out split is empty (the split hash is fixed, so this is deterministic).
        let space = |m: u64| (2..=9).flat_map(move |a| (2..=m).map(move |b| Problem { op: Op::Mul, a, b }));
        let m = (2..=20)
            .find(|&m| space(m).all(|p| p.split() == Split::Train))
            .expect("some tiny problem space has no held-out problem");
        let config = ArithmeticConfig {
            digits: [1, 1],
            ops: vec![Op::Mul],
            max_multiplier: m as u32,
            split: Split::HeldOut,
            ..Default::default()
        };
        let error = Arithmetic::new(&config, 0).expect("valid").example(0).expect_err("empty split");
        assert!(matches!(error, DataError::ProblemSpaceExhausted { split: "held_out", .. }), "{error:?}");
        assert!(error.to_string().contains("widen `digits`"), "{error}");
        // The train split of the same space still works.
        let train = Arithmetic::new(&ArithmeticConfig { split: Split::Train, ..config }, 0).expect("valid");
        assert_eq!(train.problem(0).expect("train problem").op, Op::Mul);
    }
}
