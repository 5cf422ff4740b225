//! Example programs live in `src/bin/`; this library is empty.
