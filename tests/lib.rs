//! Shared helpers for the end-to-end tests live in the test files themselves.
