//! The conformance suite against the in-memory backend.

use lockkit_testkit::conformance::MemoryHarness;

lockkit_testkit::conformance_suite!(MemoryHarness::new());
