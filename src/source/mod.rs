//! Object sources (filled in by the source work).
