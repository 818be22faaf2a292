//! The conformance suite against the in-memory backend.

use lockkit_conformance::MemoryHarness;

lockkit_conformance::conformance_suite!(MemoryHarness::new());
