//! Writing the generated tables: text sections made of a fixed head, a part
//! per row, and a fixed tail.

use std::fmt;

/// Writes `head`, then `row` for each of `rows`, then `tail`.
pub fn section<R>(
    s: &mut String,
    head: &str,
    rows: &[R],
    tail: &str,
    mut row: impl FnMut(&mut String, &R) -> fmt::Result,
) -> fmt::Result {
    s.push_str(head);
    for r in rows {
        row(s, r)?;
    }
    s.push_str(tail);
    Ok(())
}
