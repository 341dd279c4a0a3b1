//! The enums a command line offers (an answer's form, the master's
//! coordinator policy and plan) as tables of their values, each with its
//! name and what it does: one table per enum, read both ways.

/// One value of such an enum: the value, its name, what it does.
pub type Named<T> = (T, &'static str, &'static str);

/// The value named `name` in `names`, or an error naming every name
/// (`what` says what kind of value was asked for).
pub fn parse<T: Copy>(names: &[Named<T>], name: &str, what: &str) -> Result<T, String> {
    match names.iter().find(|(_, n, _)| *n == name) {
        Some(&(value, _, _)) => Ok(value),
        None => {
            let all: Vec<&str> = names.iter().map(|(_, n, _)| *n).collect();
            Err(format!("unknown {what} {name:?}: use {}", all.join(", ")))
        }
    }
}

/// The name of `value` in `names`, which lists every value.
pub fn name_of<T: Copy + PartialEq>(names: &[Named<T>], value: T) -> &'static str {
    names
        .iter()
        .find(|(v, _, _)| *v == value)
        .map(|(_, name, _)| *name)
        .expect("every value has a name")
}
