//! Network namespaces of a test's own making: servers that the test can cut
//! off from each other while the test's own clients still reach every one.
//!
//! A [`Fabric`] is a Linux bridge in the test's namespace (address
//! `10.X.Y.1/24`) and one network namespace per server, each joined to the
//! bridge by a veth pair and given `10.X.Y.(2 + i)`. A server started in
//! namespace `i` (see [`Fabric::enter`]) binds that address; the test's
//! processes reach it through the bridge. [`Fabric::cut`] drops the traffic
//! between two namespaces (a blackhole route in each, so neither side hears
//! a reset: packets vanish, as in a partition) and leaves their links to the
//! bridge, and so to the test, alone.
//!
//! Needs root (`ip netns`), as the fault suite does. Every name carries this
//! process's id, and a fabric left behind by a process that died is removed
//! by the next one that starts.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::process::{ServerError, copy_setting, run_tool};

const HINT: &str = "network namespaces need `ip` (iproute2) and root: \
                    run the tests as root, as scripts/install-services.sh and CI do";

/// A bridge and `n` network namespaces joined to it; removed when dropped.
#[derive(Debug)]
pub struct Fabric {
    tag: String,
    /// The `/24` prefix: `10.X.Y`.
    net: [u8; 3],
    namespaces: Vec<String>,
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<(), ServerError> {
    run_tool(
        &format!("`ip {}`", args.join(" ")),
        Command::new("ip").args(args),
        HINT,
    )
}

/// Names this process's fabrics start with: `lk<pid in base 36>-`.
fn prefix(pid: u32) -> String {
    let mut digits = Vec::new();
    let mut n = pid;
    loop {
        digits.push(char::from_digit(n % 36, 36).unwrap_or('0'));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    format!("lk{}-", digits.iter().rev().collect::<String>())
}

/// Whether some interface already has an address in `10.X.Y.0/24`.
fn taken(net: [u8; 3]) -> bool {
    let subnet = format!("{}.{}.{}.0/24", net[0], net[1], net[2]);
    Command::new("ip")
        .args(["-o", "addr", "show", "to", &subnet])
        .output()
        .map(|out| !out.stdout.is_empty())
        .unwrap_or(false)
}

/// Removes the namespaces and bridges of processes that are gone.
fn remove_orphans() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let listed = String::from_utf8_lossy(&output.stdout).into_owned();
    for line in listed.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some((pid, _)) = name
            .strip_prefix("lk")
            .and_then(|rest| rest.split_once('-'))
        else {
            continue;
        };
        let Ok(pid) = u32::from_str_radix(pid, 36) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", name]);
            if let Some(tag) = name.rsplit_once('n').map(|(tag, _)| tag) {
                let _ = ip(&["link", "delete", &format!("{tag}b")]);
            }
        }
    }
}

impl Fabric {
    /// A bridge and `n` namespaces (at most 200).
    pub fn create(n: usize) -> Result<Fabric, ServerError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        assert!(n <= 200, "a fabric has room for 200 namespaces");
        remove_orphans();
        let pid = std::process::id();
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        // Interface names have 15 characters at most: `lk<pid>-<serial>`
        // (at most 10) and a suffix of up to 4.
        let tag = format!("{}{}", prefix(pid), serial % 100);
        let second = 100 + (pid % 100) as u8;
        let net = (0..250u32)
            .map(|k| [10, second, ((pid / 100 + serial + k) % 250) as u8])
            .find(|net| !taken(*net))
            .ok_or_else(|| ServerError::Io {
                what: format!("find a free 10.{second}.*.0/24 for a network fabric"),
                source: std::io::Error::other("every one is taken"),
            })?;
        let mut fabric = Fabric {
            tag,
            net,
            namespaces: Vec::new(),
        };
        let bridge = fabric.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", fabric.gateway()),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..n {
            let ns = format!("{}n{i}", fabric.tag);
            ip(&["netns", "add", &ns])?;
            fabric.namespaces.push(ns.clone());
            let (outer, inner) = (format!("{}h{i}", fabric.tag), format!("{}v{i}", fabric.tag));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &bridge, "up"])?;
            let addr = format!("{}/24", fabric.ip(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(fabric)
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    /// The bridge's address: the test's side.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], 1)
    }

    /// The address of namespace `i`.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], 2 + i as u8)
    }

    /// How many namespaces there are.
    pub fn len(&self) -> usize {
        self.namespaces.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// `command` run inside namespace `i` (`ip netns exec`, which then execs
    /// the program, so its process id is the program's).
    pub fn enter(&self, i: usize, command: &Command) -> Command {
        let mut entered = Command::new("ip");
        entered
            .args(["netns", "exec", &self.namespaces[i]])
            .arg(command.get_program())
            .args(command.get_args());
        copy_setting(command, &mut entered);
        entered
    }

    /// Cuts (`true`) or heals the link between namespaces `a` and `b`: every
    /// packet between them is dropped, their links to the bridge stay.
    pub fn cut(&self, a: usize, b: usize, on: bool) -> Result<(), ServerError> {
        let verb = if on { "add" } else { "delete" };
        for (from, to) in [(a, b), (b, a)] {
            let target = format!("{}/32", self.ip(to));
            ip(&[
                "-n",
                &self.namespaces[from],
                "route",
                verb,
                "blackhole",
                &target,
            ])?;
        }
        Ok(())
    }

    /// Cuts (`true`) or heals every link between namespace `a` and the
    /// others.
    pub fn isolate(&self, a: usize, on: bool) -> Result<(), ServerError> {
        (0..self.len())
            .filter(|&b| b != a)
            .try_for_each(|b| self.cut(a, b, on))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = ip(&["netns", "delete", ns]);
        }
        let _ = ip(&["link", "delete", &self.bridge()]);
    }
}
