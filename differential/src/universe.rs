//! The values cases are drawn from: a small universe per kind, so overlaps
//! and near misses are frequent (nested v4 and v6 prefixes, /0 and
//! full-length prefixes, an address and the /32 naming it, a path and its
//! parent, `*`, `*.` names at and below the apex, case, trailing dots), and
//! events drawn from the same universe plus misses.

use crate::model::{Behavior, Cluster, Event, Kind, Mode, Policy};
use proptest::prelude::*;
use std::net::IpAddr;

/// Network values.
pub const NETWORK: &[&str] = &[
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.0/24",
    "10.1.2.3",
    "10.1.2.3/32",
    "10.1.2.4",
    "0.0.0.0/0",
    "192.0.2.0/24",
    "fd00::/8",
    "fd00:1::/32",
    "fd00:1::1",
    "fd00:1::1/128",
    "::/0",
    // Host bits: accepted with a warning, the network is what is matched.
    "10.1.2.3/24",
    "fd00:1::1/64",
    "api.prod.svc",
    "db.prod.svc.cluster.local",
    // Domains, one written as users do (case, trailing dot).
    "good.example",
    "Evil.Example.",
];

/// The Services of the cluster: one with a v4 and a v6 ClusterIP, one
/// whose endpoint is also a literal value of the universe. The domains the
/// pod resolved: one with a v4 and a v6 address, one whose address is also
/// a literal value (and inside literal prefixes).
pub fn cluster() -> Cluster {
    let addrs = |list: &[&str]| list.iter().filter_map(|a| a.parse().ok()).collect();
    Cluster {
        services: vec![
            (
                "prod".into(),
                "api".into(),
                addrs(&["10.96.0.10", "fd00:96::10"]),
            ),
            (
                "prod".into(),
                "db".into(),
                addrs(&["10.96.0.20", "10.1.2.3"]),
            ),
        ],
        domains: vec![
            ("good.example".into(), addrs(&["10.50.0.1", "fd00:50::1"])),
            ("evil.example".into(), addrs(&["10.50.0.2", "10.1.2.4"])),
        ],
    }
}

/// Addresses events connect to: the universe's and misses.
pub const ADDRESSES: &[&str] = &[
    "10.1.2.3",
    "10.1.2.4",
    "10.1.3.1",
    "10.2.0.1",
    "11.0.0.1",
    "192.0.2.7",
    "fd00:1::1",
    "fd00:1::2",
    "fd01::1",
    "2001:db8::1",
    "10.96.0.10",
    "10.96.0.20",
    "fd00:96::10",
    "10.50.0.1",
    "10.50.0.2",
    "fd00:50::1",
];

/// Open and exec values (exact paths, a parent directory among them).
pub const PATHS: &[&str] = &[
    "/bin/sh",
    "/bin/bash",
    "/usr/bin/curl",
    "/etc/shadow",
    "/etc/passwd",
    "/etc",
];

/// Paths events open or execute: the universe's and misses.
pub const EVENT_PATHS: &[&str] = &[
    "/bin/sh",
    "/bin/bash",
    "/usr/bin/curl",
    "/etc/shadow",
    "/etc/passwd",
    "/etc",
    "/etc/hosts",
    "/bin",
];

/// Protocol tokens.
pub const PROTOCOLS: &[&str] = &[
    "ssh",
    "tls",
    "tls/h2",
    "tls/http/1.1",
    "dns",
    "http/1.1",
    "http/2",
    "quic",
];

/// Flows events classify: (protocol, ALPN).
pub const FLOWS: &[(&str, Option<&str>)] = &[
    ("ssh", None),
    ("tls", None),
    ("tls", Some("h2")),
    ("tls", Some("http/1.1")),
    ("dns", None),
    ("http/1.1", None),
    ("http/2", None),
    ("quic", None),
    ("unclassified", None),
];

/// DNS values.
pub const NAMES: &[&str] = &[
    "example.com",
    "*.example.com",
    "api.example.com",
    "EXAMPLE.com.",
    "other.org",
];

/// Names events ask for.
pub const QUESTIONS: &[&str] = &[
    "example.com",
    "api.example.com",
    "a.b.example.com",
    "evilexample.com",
    "other.org",
    "unrelated.net",
];

/// The values of each kind, as a driver draws them.
pub type Values = fn(Kind) -> Vec<String>;

/// The universe's values of `kind`.
pub fn values_of(kind: Kind) -> Vec<String> {
    let list = match kind {
        Kind::Network => NETWORK,
        Kind::Open | Kind::Exec => PATHS,
        Kind::Protocol => PROTOCOLS,
        Kind::Dns => NAMES,
    };
    list.iter().map(|v| (*v).to_owned()).collect()
}

/// One behavior of `kind` with values from `values`: `"*"` in deny one
/// time in three (alone on a dns behavior, as the schema requires); a dns
/// behavior may be empty (inert), the others have a value on some side.
fn behavior(kind: Kind, values: Values) -> impl Strategy<Value = Behavior> {
    let list = prop::collection::vec(prop::sample::select(values(kind)), 0..=3);
    (list.clone(), list, prop::bool::weighted(0.33)).prop_filter_map(
        "a behavior with a value",
        move |(allow, mut deny, star)| {
            if star {
                if kind == Kind::Dns {
                    deny.clear();
                }
                deny.insert(0, "*".to_owned());
            }
            if kind != Kind::Dns && allow.is_empty() && deny.is_empty() {
                return None;
            }
            Some(Behavior { kind, allow, deny })
        },
    )
}

/// One policy with 1 to 3 behaviors of `kinds` (kinds may repeat); dns
/// only in monitor mode (the compiler refuses it in enforce); it selects
/// the pod four times in five.
pub fn policy_of(name: String, kinds: &[Kind], values: Values) -> impl Strategy<Value = Policy> {
    let kind = prop::sample::select(kinds.to_vec());
    (
        prop::bool::ANY,
        prop::bool::weighted(0.8),
        prop::collection::vec(kind.prop_flat_map(move |k| behavior(k, values)), 1..=3),
    )
        .prop_map(move |(enforce, selects, behaviors)| {
            let dns = behaviors.iter().any(|b| b.kind == Kind::Dns);
            Policy {
                name: name.clone(),
                mode: if enforce && !dns {
                    Mode::Enforce
                } else {
                    Mode::Monitor
                },
                selects,
                behaviors,
            }
        })
}

/// One policy of any kinds, from the universe's values.
pub fn policy(name: String) -> impl Strategy<Value = Policy> {
    policy_of(name, &Kind::ALL, values_of)
}

/// 1 to 8 policies of `kinds`, named p0, p1, ...
pub fn policies_of(kinds: &'static [Kind], values: Values) -> impl Strategy<Value = Vec<Policy>> {
    (1usize..=8).prop_flat_map(move |n| {
        (0..n)
            .map(|i| policy_of(format!("p{i}"), kinds, values))
            .collect::<Vec<_>>()
    })
}

/// 1 to 8 policies of any kinds, from the universe's values.
pub fn policies() -> impl Strategy<Value = Vec<Policy>> {
    policies_of(&Kind::ALL, values_of)
}

/// One event of any kind.
pub fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        prop::sample::select(ADDRESSES).prop_map(|a| Event::Connect(
            a.parse::<IpAddr>().unwrap_or(IpAddr::from([0, 0, 0, 0]))
        )),
        prop::sample::select(EVENT_PATHS).prop_map(|p| Event::Open(p.to_owned())),
        prop::sample::select(EVENT_PATHS).prop_map(|p| Event::Exec(p.to_owned())),
        prop::sample::select(FLOWS).prop_map(|(protocol, alpn)| Event::Protocol { protocol, alpn }),
        prop::sample::select(QUESTIONS).prop_map(|q| Event::Dns(q.to_owned())),
    ]
}

/// Every event of the universe, for the sequences' probes.
pub fn every_event() -> Vec<Event> {
    let mut out: Vec<Event> = ADDRESSES
        .iter()
        .filter_map(|a| a.parse().ok().map(Event::Connect))
        .collect();
    for p in EVENT_PATHS {
        out.push(Event::Open((*p).to_owned()));
        out.push(Event::Exec((*p).to_owned()));
    }
    for (protocol, alpn) in FLOWS {
        out.push(Event::Protocol {
            protocol,
            alpn: *alpn,
        });
    }
    out.extend(QUESTIONS.iter().map(|q| Event::Dns((*q).to_owned())));
    out
}
