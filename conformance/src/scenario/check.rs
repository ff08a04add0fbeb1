//! Checking a scenario as written: every reference resolves (pods,
//! containers, namespaces, policies, Services, the resolver), every step
//! has exactly one kind and an expectation that fits it, and every error
//! names the file and the field's path.

use super::*;

pub(super) struct Checker<'a> {
    pub(super) file: &'a str,
}

impl Checker<'_> {
    fn bad(&self, field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Invalid {
            file: self.file.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }

    pub(super) fn scenario(&self, path: &Path, raw: RawScenario) -> Result<Scenario> {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if raw.name != stem {
            return Err(self.bad(
                "name",
                format!(
                    "{:?} must be the file's name without .yaml ({stem:?})",
                    raw.name
                ),
            ));
        }
        self.dns_label("name", &raw.name)?;
        if raw.description.trim().is_empty() {
            return Err(self.bad("description", "say what the scenario proves"));
        }
        for (i, n) in raw.not_on.iter().enumerate() {
            if n.reason.trim().is_empty() {
                return Err(self.bad(format!("notOn[{i}].reason"), "give the reason"));
            }
        }
        if raw.namespaces.is_empty() {
            return Err(self.bad("namespaces", "at least one namespace"));
        }
        let mut ns_names = BTreeSet::new();
        for (i, ns) in raw.namespaces.iter().enumerate() {
            self.dns_label(&format!("namespaces[{i}].name"), &ns.name)?;
            if !ns_names.insert(ns.name.clone()) {
                return Err(self.bad(
                    format!("namespaces[{i}].name"),
                    format!("{:?} twice", ns.name),
                ));
            }
        }
        let only_ns = (raw.namespaces.len() == 1).then(|| raw.namespaces[0].name.clone());
        let namespace_of = |field: String, given: &Option<String>| -> Result<String> {
            match (given, &only_ns) {
                (Some(ns), _) if ns_names.contains(ns) => Ok(ns.clone()),
                (Some(ns), _) => {
                    Err(self.bad(field, format!("no namespace {ns:?} in this scenario")))
                }
                (None, Some(ns)) => Ok(ns.clone()),
                (None, None) => {
                    Err(self.bad(field, "name the namespace: the scenario has several"))
                }
            }
        };
        let mut pods = Vec::new();
        let mut pod_names = BTreeSet::new();
        for (i, p) in raw.pods.iter().enumerate() {
            self.dns_label(&format!("pods[{i}].name"), &p.name)?;
            if !pod_names.insert(p.name.clone()) {
                return Err(self.bad(
                    format!("pods[{i}].name"),
                    format!(
                        "{:?} twice (steps name pods without their namespace)",
                        p.name
                    ),
                ));
            }
            let mut pod = p.clone();
            pod.namespace = Some(namespace_of(format!("pods[{i}].namespace"), &p.namespace)?);
            if pod.containers.is_empty() {
                pod.containers.push("app".into());
            }
            let mut seen = BTreeSet::new();
            for (j, c) in pod.containers.iter().enumerate() {
                self.dns_label(&format!("pods[{i}].containers[{j}]"), c)?;
                if !seen.insert(c) {
                    return Err(
                        self.bad(format!("pods[{i}].containers[{j}]"), format!("{c:?} twice"))
                    );
                }
            }
            pods.push(pod);
        }
        for (i, p) in raw.setup.programs.iter().enumerate() {
            self.fixture(&format!("setup.programs[{i}]"), p)?;
        }
        for (i, p) in raw.setup.files.iter().enumerate() {
            self.fixture(&format!("setup.files[{i}]"), p)?;
        }
        if let Some(r) = &raw.resolver {
            if r.records.is_empty() {
                return Err(self.bad("resolver.records", "at least one name"));
            }
            for name in r.records.keys() {
                if name.is_empty()
                    || name.len() > 253
                    || name.split('.').any(|l| l.is_empty() || l.len() > 63)
                {
                    return Err(self.bad(format!("resolver.records.{name}"), "not a domain name"));
                }
            }
        }
        let mut services = Vec::new();
        for (i, s) in raw.services.iter().enumerate() {
            self.dns_label(&format!("services[{i}].name"), &s.name)?;
            let mut svc = s.clone();
            svc.namespace = Some(namespace_of(
                format!("services[{i}].namespace"),
                &s.namespace,
            )?);
            if !matches!(s.cluster_ip, IpAddr::V4(a) if a.octets()[0] == 10 && a.octets()[1] == 96)
            {
                return Err(self.bad(
                    format!("services[{i}].clusterIP"),
                    "must be in the local API server's Service range 10.96.0.0/16",
                ));
            }
            services.push(svc);
        }
        let mut policy_names = BTreeSet::new();
        for (i, p) in raw.policies.iter().enumerate() {
            self.policy(&format!("policies[{i}]"), p)?;
            if !policy_names.insert(p.name.clone()) {
                return Err(self.bad(format!("policies[{i}].name"), format!("{:?} twice", p.name)));
            }
        }
        let ctx = Context {
            pods: &pods,
            namespaces: &ns_names,
            services: &services,
            resolver: raw.resolver.as_ref(),
            policies: policy_names,
        };
        if raw.steps.is_empty() {
            return Err(self.bad("steps", "at least one step"));
        }
        let mut steps = Vec::new();
        let mut ctx = ctx;
        for (i, s) in raw.steps.iter().enumerate() {
            steps.push(self.step(&format!("steps[{i}]"), i + 1, s, &mut ctx, Nesting::Top)?);
        }
        Ok(Scenario {
            name: raw.name,
            file: self.file.to_string(),
            description: raw.description.trim().to_string(),
            not_on: raw.not_on,
            namespaces: raw.namespaces,
            pods,
            setup: raw.setup,
            resolver: raw.resolver,
            services,
            policies: raw.policies,
            steps,
        })
    }

    fn dns_label(&self, field: &str, s: &str) -> Result<()> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-');
        if ok {
            Ok(())
        } else {
            Err(self.bad(
                field,
                format!("{s:?} is not a DNS label (a-z, 0-9, '-', at most 63)"),
            ))
        }
    }

    fn fixture(&self, field: &str, path: &str) -> Result<()> {
        let under = Path::new(path)
            .strip_prefix(FIXTURE_ROOT)
            .ok()
            .filter(|rest| !rest.as_os_str().is_empty());
        if under.is_none() || path.contains("/../") || path.ends_with("/..") {
            return Err(self.bad(
                field,
                format!("{path:?} must be a file under {FIXTURE_ROOT}/ (the only place a run creates files)"),
            ));
        }
        Ok(())
    }

    fn policy(&self, field: &str, p: &PolicyDef) -> Result<()> {
        if p.name.is_empty()
            || p.name.len() > 253
            || !p
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(self.bad(
                format!("{field}.name"),
                format!("{:?} is not an object name", p.name),
            ));
        }
        serde_json::from_value::<kyverno_runtime_api::runtimepolicy::RuntimePolicySpec>(
            p.spec.clone(),
        )
        .map_err(|e| {
            self.bad(
                format!("{field}.spec"),
                format!("not a RuntimePolicy spec: {e}"),
            )
        })?;
        Ok(())
    }

    fn step(
        &self,
        field: &str,
        number: usize,
        raw: &RawStep,
        ctx: &mut Context<'_>,
        nesting: Nesting,
    ) -> Result<Step> {
        let mut kinds: Vec<&str> = Vec::new();
        let mut note = |set: bool, name: &'static str| {
            if set {
                kinds.push(name);
            }
        };
        note(raw.exec.is_some(), "exec");
        note(raw.open.is_some(), "open");
        note(raw.connect.is_some(), "connect");
        note(raw.resolve.is_some(), "resolve");
        note(raw.report.is_some(), "report");
        note(raw.condition.is_some(), "condition");
        note(raw.shard.is_some(), "shard");
        note(raw.metric.is_some(), "metric");
        note(raw.relabel.is_some(), "relabel");
        note(raw.apply_policy.is_some(), "applyPolicy");
        note(raw.delete_policy.is_some(), "deletePolicy");
        note(raw.delete_service.is_some(), "deleteService");
        note(raw.restart_daemon.is_some(), "restartDaemon");
        let kind = match kinds.as_slice() {
            [one] => *one,
            [] => return Err(self.bad(field, "a step needs one of exec, open, connect, resolve, report, condition, shard, metric, relabel, applyPolicy, deletePolicy, deleteService, restartDaemon")),
            many => return Err(self.bad(field, format!("one kind per step, got {}", many.join(", ")))),
        };
        let within = match &raw.within {
            None => DEFAULT_WITHIN,
            Some(w) => match parse_duration(w) {
                Some(d) if d <= MAX_WITHIN && !d.is_zero() => d,
                Some(_) => {
                    return Err(self.bad(
                        format!("{field}.within"),
                        format!("{w:?} is outside 1ms..{}s", MAX_WITHIN.as_secs()),
                    ))
                }
                None => {
                    return Err(self.bad(
                        format!("{field}.within"),
                        format!("{w:?} is not a duration like 500ms, 30s or 2m"),
                    ))
                }
            },
        };
        let is_action = matches!(kind, "exec" | "open" | "connect" | "resolve");
        if !is_action && (raw.expect.is_some() || raw.errno.is_some()) {
            return Err(self.bad(
                format!("{field}.expect"),
                format!("only actions have an expected outcome ({kind} is not one)"),
            ));
        }
        let allowed_here = match nesting {
            Nesting::Top => true,
            Nesting::Throughout => is_action,
            Nesting::WhileDown => {
                is_action
                    || matches!(
                        kind,
                        "relabel" | "applyPolicy" | "deletePolicy" | "deleteService"
                    )
            }
        };
        if !allowed_here {
            let what = match nesting {
                Nesting::Throughout => "restartDaemon.throughout holds actions only",
                Nesting::WhileDown => "restartDaemon.whileDown holds actions and mutations (relabel, applyPolicy, deletePolicy, deleteService)",
                Nesting::Top => "",
            };
            return Err(self.bad(field, what));
        }
        if nesting != Nesting::Top && (raw.when.is_some() || raw.within.is_some()) {
            return Err(self.bad(
                field,
                "nested steps take the restart's `when` and have no `within`",
            ));
        }
        let kind = if is_action {
            let action = if let Some(a) = &raw.exec {
                self.pod_ref(
                    &format!("{field}.exec"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                self.absolute(&format!("{field}.exec.path"), &a.path)?;
                Action::Exec(a.clone())
            } else if let Some(a) = &raw.open {
                self.pod_ref(
                    &format!("{field}.open"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                self.absolute(&format!("{field}.open.path"), &a.path)?;
                Action::Open(a.clone())
            } else if let Some(a) = &raw.connect {
                self.pod_ref(
                    &format!("{field}.connect"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                self.connect(&format!("{field}.connect"), a, ctx)?;
                Action::Connect(a.clone())
            } else if let Some(a) = &raw.resolve {
                self.pod_ref(
                    &format!("{field}.resolve"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                if ctx.resolver.is_none() {
                    return Err(
                        self.bad(format!("{field}.resolve"), "the scenario has no resolver")
                    );
                }
                Action::Resolve(a.clone())
            } else {
                return Err(self.bad(field, "no action"));
            };
            let expect = raw.expect.ok_or_else(|| {
                self.bad(
                    format!("{field}.expect"),
                    "an action needs an expected outcome",
                )
            })?;
            let fits = match &action {
                Action::Exec(_) | Action::Open(_) => {
                    matches!(expect, Expect::Allowed | Expect::Refused)
                }
                Action::Connect(_) => matches!(expect, Expect::Delivered | Expect::Dropped),
                Action::Resolve(_) => matches!(expect, Expect::Answered | Expect::Nxdomain),
            };
            if !fits {
                let want = match &action {
                    Action::Exec(_) | Action::Open(_) => "allowed or refused",
                    Action::Connect(_) => "delivered or dropped",
                    Action::Resolve(_) => "answered or nxdomain",
                };
                return Err(self.bad(
                    format!("{field}.expect"),
                    format!("{expect} does not fit {kind}: expect {want}"),
                ));
            }
            let errno = match (&raw.errno, expect) {
                (None, _) => "EPERM".to_string(),
                (Some(e), Expect::Refused) if KNOWN_ERRNOS.contains(&e.as_str()) => e.clone(),
                (Some(e), Expect::Refused) => {
                    return Err(self.bad(
                        format!("{field}.errno"),
                        format!("{e:?} is not one of {}", KNOWN_ERRNOS.join(", ")),
                    ))
                }
                (Some(_), _) => {
                    return Err(self.bad(
                        format!("{field}.errno"),
                        "an errno goes with expect: refused",
                    ))
                }
            };
            StepKind::Action {
                action,
                expect,
                errno,
            }
        } else if let Some(r) = &raw.report {
            self.pod_ref(&format!("{field}.report"), &r.pod, None, ctx)?;
            self.policy_ref(&format!("{field}.report.policy"), &r.policy, ctx)?;
            if !BEHAVIORS.contains(&r.behavior.as_str()) {
                return Err(self.bad(
                    format!("{field}.report.behavior"),
                    format!("{:?} is not one of {}", r.behavior, BEHAVIORS.join(", ")),
                ));
            }
            if let Some(result) = &r.result {
                if !["fail", "warn", "pass"].contains(&result.as_str()) {
                    return Err(self.bad(
                        format!("{field}.report.result"),
                        format!("{result:?} is not fail, warn or pass"),
                    ));
                }
            }
            let counts = [r.count.is_some(), r.min_count.is_some(), r.absent]
                .iter()
                .filter(|b| **b)
                .count();
            if counts != 1 {
                return Err(self.bad(
                    format!("{field}.report"),
                    "exactly one of count, minCount, absent",
                ));
            }
            if r.absent && (r.enforced.is_some() || r.result.is_some() || !r.properties.is_empty())
            {
                return Err(self.bad(
                    format!("{field}.report"),
                    "an absent result has no other fields",
                ));
            }
            StepKind::Report(r.clone())
        } else if let Some(c) = &raw.condition {
            self.policy_ref(&format!("{field}.condition.policy"), &c.policy, ctx)?;
            if !["True", "False", "Unknown"].contains(&c.status.as_str()) {
                return Err(self.bad(
                    format!("{field}.condition.status"),
                    format!("{:?} is not \"True\", \"False\" or \"Unknown\"", c.status),
                ));
            }
            StepKind::Condition(c.clone())
        } else if let Some(s) = &raw.shard {
            self.policy_ref(&format!("{field}.shard.policy"), &s.policy, ctx)?;
            if s.no_message && s.message_contains.is_some() {
                return Err(self.bad(
                    format!("{field}.shard"),
                    "noMessage and messageContains contradict",
                ));
            }
            for (b, v) in &s.backends {
                if !["open", "exec", "network", "protocol", "dns", "execArgv"].contains(&b.as_str())
                {
                    return Err(self.bad(
                        format!("{field}.shard.backends.{b}"),
                        "not a behavior of the plan",
                    ));
                }
                if v == OPEN_EXEC_OF_NODE && !["open", "exec"].contains(&b.as_str()) {
                    return Err(self.bad(
                        format!("{field}.shard.backends.{b}"),
                        format!("{OPEN_EXEC_OF_NODE} stands for the open/exec backend only"),
                    ));
                }
            }
            for (name, state) in &s.event_sources {
                if !["Available", "Starting", "Failed"].contains(&state.as_str()) {
                    return Err(self.bad(
                        format!("{field}.shard.eventSources.{name}"),
                        format!("{state:?} is not Available, Starting or Failed"),
                    ));
                }
            }
            StepKind::Shard(s.clone())
        } else if let Some(m) = &raw.metric {
            if !m.name.starts_with("nirmata_runtime_") {
                return Err(self.bad(
                    format!("{field}.metric.name"),
                    "the daemon's series start with nirmata_runtime_",
                ));
            }
            if m.at_least.is_some() == m.equals.is_some() {
                return Err(self.bad(format!("{field}.metric"), "exactly one of atLeast, equals"));
            }
            StepKind::Metric(m.clone())
        } else if let Some(r) = &raw.relabel {
            match (&r.pod, &r.namespace) {
                (Some(p), None) => self.pod_ref(&format!("{field}.relabel"), p, None, ctx)?,
                (None, Some(n)) if ctx.namespaces.contains(n) => {}
                (None, Some(n)) => {
                    return Err(self.bad(
                        format!("{field}.relabel.namespace"),
                        format!("no namespace {n:?} in this scenario"),
                    ))
                }
                _ => return Err(self.bad(format!("{field}.relabel"), "name a pod or a namespace")),
            }
            StepKind::Relabel(r.clone())
        } else if let Some(p) = &raw.apply_policy {
            self.policy(&format!("{field}.applyPolicy"), p)?;
            ctx.policies.insert(p.name.clone());
            StepKind::ApplyPolicy(p.clone())
        } else if let Some(n) = &raw.delete_policy {
            self.policy_ref(&format!("{field}.deletePolicy.name"), &n.name, ctx)?;
            StepKind::DeletePolicy(n.name.clone())
        } else if let Some(n) = &raw.delete_service {
            if !ctx.services.iter().any(|s| s.name == n.name) {
                return Err(self.bad(
                    format!("{field}.deleteService.name"),
                    format!("no Service {:?} in this scenario", n.name),
                ));
            }
            StepKind::DeleteService(n.name.clone())
        } else if let Some(r) = &raw.restart_daemon {
            let mut throughout = Vec::new();
            for (i, s) in r.throughout.iter().enumerate() {
                throughout.push(self.step(
                    &format!("{field}.restartDaemon.throughout[{i}]"),
                    number,
                    s,
                    ctx,
                    Nesting::Throughout,
                )?);
            }
            let mut while_down = Vec::new();
            for (i, s) in r.while_down.iter().enumerate() {
                while_down.push(self.step(
                    &format!("{field}.restartDaemon.whileDown[{i}]"),
                    number,
                    s,
                    ctx,
                    Nesting::WhileDown,
                )?);
            }
            for (i, a) in r.args.iter().enumerate() {
                if !a.starts_with("--")
                    || ["--node-name", "--pin-dir", "--metrics-addr"]
                        .iter()
                        .any(|f| a.starts_with(f))
                {
                    return Err(self.bad(format!("{field}.restartDaemon.args[{i}]"), format!("{a:?}: a --flag, other than the node name, pin dir and metrics address the runner sets")));
                }
            }
            StepKind::RestartDaemon(Restart {
                throughout,
                while_down,
                args: r.args.clone(),
            })
        } else {
            return Err(self.bad(field, "no step kind"));
        };
        Ok(Step {
            number,
            kind,
            when: raw.when,
            within,
            broken: false,
        })
    }

    fn pod_ref(
        &self,
        field: &str,
        pod: &str,
        container: Option<&str>,
        ctx: &Context<'_>,
    ) -> Result<()> {
        let Some(p) = ctx.pods.iter().find(|p| p.name == pod) else {
            let names: Vec<&str> = ctx.pods.iter().map(|p| p.name.as_str()).collect();
            return Err(self.bad(
                format!("{field}.pod"),
                format!("no pod {pod:?} (pods: {})", names.join(", ")),
            ));
        };
        if let Some(c) = container {
            if !p.containers.iter().any(|x| x == c) {
                return Err(self.bad(
                    format!("{field}.container"),
                    format!("pod {pod:?} has no container {c:?}"),
                ));
            }
        }
        Ok(())
    }

    fn policy_ref(&self, field: &str, name: &str, ctx: &Context<'_>) -> Result<()> {
        if ctx.policies.contains(name) {
            Ok(())
        } else {
            Err(self.bad(
                field,
                format!(
                    "no policy {name:?} in this scenario (policies, or an earlier applyPolicy)"
                ),
            ))
        }
    }

    fn absolute(&self, field: &str, path: &str) -> Result<()> {
        if path.starts_with('/') {
            Ok(())
        } else {
            Err(self.bad(field, format!("{path:?} is not an absolute path")))
        }
    }

    fn connect(&self, field: &str, a: &ConnectAction, ctx: &Context<'_>) -> Result<()> {
        match (&a.to, &a.name, a.port) {
            (Some(to), None, None) => {
                if to.port() == 0 {
                    return Err(self.bad(format!("{field}.to"), "port 0"));
                }
                if a.ipv6 {
                    return Err(self.bad(
                        format!("{field}.ipv6"),
                        "ipv6 chooses the question type of `name`; `to` says its family",
                    ));
                }
            }
            (None, Some(name), Some(port)) if port != 0 => {
                let Some(r) = ctx.resolver else {
                    return Err(self.bad(
                        format!("{field}.name"),
                        "connecting by name needs the scenario's resolver",
                    ));
                };
                let family_ok = r
                    .records
                    .get(name)
                    .is_none_or(|addrs| addrs.iter().any(|ip| ip.is_ipv6() == a.ipv6));
                if !family_ok {
                    return Err(self.bad(
                        format!("{field}.name"),
                        format!(
                            "the resolver has no {} record for {name:?}",
                            if a.ipv6 { "AAAA" } else { "A" }
                        ),
                    ));
                }
            }
            _ => return Err(self.bad(field, "give `to: ADDR:PORT`, or `name` and `port`")),
        }
        if a.alpn.is_some() && a.send != Payload::Tls {
            return Err(self.bad(format!("{field}.alpn"), "an ALPN goes with send: tls"));
        }
        if let Some(alpn) = &a.alpn {
            if alpn.is_empty() || alpn.len() > 255 {
                return Err(self.bad(format!("{field}.alpn"), "1 to 255 bytes"));
            }
        }
        if a.transport == Transport::Udp && matches!(a.send, Payload::Ssh | Payload::Tls) {
            return Err(self.bad(
                format!("{field}.send"),
                "ssh and tls are streams: use transport tcp",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nesting {
    Top,
    Throughout,
    WhileDown,
}

struct Context<'a> {
    pods: &'a [PodDef],
    namespaces: &'a BTreeSet<String>,
    services: &'a [ServiceDef],
    resolver: Option<&'a ResolverDef>,
    policies: BTreeSet<String>,
}
