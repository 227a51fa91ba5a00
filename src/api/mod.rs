//! API types (filled in by the api work).
