//! Unit tests of the process plumbing.

use super::*;
use std::fs;
use std::process::Command;
use std::time::Duration;

#[test]
fn a_second_build_of_a_template_is_discarded() {
    let root = tempfile::tempdir().unwrap();
    let template = root.path().join("t");
    let first = tempfile::tempdir_in(root.path()).unwrap();
    fs::write(first.path().join("who"), "first").unwrap();
    let second = tempfile::tempdir_in(root.path()).unwrap();
    fs::write(second.path().join("who"), "second").unwrap();
    let second_path = second.path().to_path_buf();

    publish_template(first, &template).unwrap();
    publish_template(second, &template).unwrap();
    assert_eq!(fs::read_to_string(template.join("who")).unwrap(), "first");
    assert!(!second_path.exists(), "the losing build was not removed");
    let left: Vec<_> = fs::read_dir(root.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn children_of_finds_a_child_and_is_dead_sees_it_exit() {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let children = children_of(std::process::id());
    let found = children
        .iter()
        .find(|process| process.pid == child.id())
        .copied()
        .unwrap_or_else(|| panic!("{} not in {children:?}", child.id()));
    assert!(!is_dead(found));
    child.kill().unwrap();
    assert!(wait_until_dead(&[found], Duration::from_secs(2)));
    child.wait().unwrap();
    assert!(is_dead(found));
}

#[test]
fn file_name_part_keeps_only_safe_characters() {
    assert_eq!(
        file_name_part("10.11.19-MariaDB-0+deb12u1 x/y"),
        "10.11.19-MariaDB-0+deb12u1_x_y"
    );
}

#[test]
fn free_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() {
    let below = ephemeral_ports_start();
    assert!(
        below > FIRST_TEST_PORT + MIN_TEST_PORTS,
        "this machine's ephemeral range starts at {below}"
    );
    let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
    for &port in &ports {
        assert!(
            (FIRST_TEST_PORT..below).contains(&port),
            "port {port} is not in {FIRST_TEST_PORT}..{below}"
        );
        // Free when handed out: a server can bind it.
        std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
            .unwrap_or_else(|e| panic!("port {port} is taken: {e}"));
    }
    let distinct: std::collections::HashSet<_> = ports.iter().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
}
