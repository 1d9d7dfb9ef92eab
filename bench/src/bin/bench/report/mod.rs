//! The results for people (the text report: tables, what they show, the
//! targets) and for machines (results.json, results.csv, chart.svg), each
//! in the file named for what it prints.

pub mod csv;
pub mod explain;
pub mod figures;
pub mod json;
pub mod overlap;
pub mod rows;
pub mod svg;
pub mod table;
pub mod text;
