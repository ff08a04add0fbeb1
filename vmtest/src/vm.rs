//! Booting one guest under qemu and reading back what happened.
//!
//! Each boot is bounded: qemu runs with `-no-reboot` and `panic=-1`, so a
//! guest that reboots, powers off or panics makes qemu exit at once;
//! `softlockup_panic=1` turns a CPU stuck in the kernel for 20 s (seen once
//! under TCG: a 5.10 guest's ksoftirqd spinning for good) into such a
//! panic, with its trace on the console, instead of a wait for the
//! per-boot timeout; and that hard timeout kills qemu when the guest hangs
//! any other way. What the guest
//! printed is then classified by [`classify`] into an outcome or a typed
//! error (timeout, kernel panic, setup failure, no sentinel).

use std::fmt;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::error::{describe_status, tail, Error, Result};
use crate::initramfs::{self, sentinel_prefix, Contents};
use crate::kernel::Kernel;
use crate::modules;

/// Default per-boot timeout: generous for TCG, where a boot takes seconds
/// but a BPF-heavy test may take a minute.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(180);
/// Default guest memory.
pub const DEFAULT_MEMORY_MIB: u32 = 1024;
/// Guest CPUs. Two, so per-CPU maps and cross-CPU races are exercised, while
/// staying within the two cores of the build machines.
pub const GUEST_CPUS: u32 = 2;
/// Lines of console kept in error reports.
const TAIL_LINES: usize = 40;
/// How often a running qemu is checked for exit, timeout or KVM failure.
const POLL: Duration = Duration::from_millis(20);

/// Which LSM list the guest kernel boots with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LsmMode {
    /// `bpf` in the LSM list: BPF-LSM programs run.
    Bpf,
    /// `bpf` left out: LSM programs load and attach but never run, the
    /// situation the fmod_ret fallback exists for.
    NoBpf,
}

impl LsmMode {
    /// Both modes, `bpf` first.
    pub const ALL: [LsmMode; 2] = [LsmMode::Bpf, LsmMode::NoBpf];

    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LsmMode::Bpf => "bpf",
            LsmMode::NoBpf => "nobpf",
        }
    }

    /// The `lsm=` value. Names a kernel does not have (landlock on 5.10) are
    /// ignored by it; the guest's `/sys/kernel/security/lsm` says what is active.
    pub fn lsm_list(self) -> &'static str {
        match self {
            LsmMode::Bpf => "lockdown,capability,landlock,yama,apparmor,bpf",
            LsmMode::NoBpf => "lockdown,capability,landlock,yama",
        }
    }

    /// Whether `bpf` is expected in the guest's active LSM list.
    pub fn expects_bpf(self) -> bool {
        self == LsmMode::Bpf
    }
}

impl fmt::Display for LsmMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LsmMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "bpf" => Ok(LsmMode::Bpf),
            "nobpf" | "no-bpf" => Ok(LsmMode::NoBpf),
            other => Err(Error::UnknownLsmMode(other.to_owned())),
        }
    }
}

/// Parses a comma-separated list of LSM modes (`bpf,nobpf`).
pub fn parse_lsm_list(s: &str) -> Result<Vec<LsmMode>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// Whether an active LSM list (`/sys/kernel/security/lsm`) contains `bpf`.
pub fn lsm_list_has_bpf(list: &str) -> bool {
    list.trim().split(',').any(|l| l == "bpf")
}

/// The kernel command line for a mode.
pub fn kernel_cmdline(lsm: LsmMode) -> String {
    format!(
        "console=ttyS0 panic=-1 softlockup_panic=1 lsm={} quiet",
        lsm.lsm_list()
    )
}

/// The address in the guest's network behind which the host forwards sit:
/// one slirp does not use for anything else in 10.0.2.0/24 (the gateway is
/// .2, DNS .3, DHCP hands out .15 on), as in qemu's own `guestfwd` examples.
pub const FORWARD_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// The guest's own address on `eth0`: slirp's usual guest address.
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The guest network's prefix length (slirp's 10.0.2.0/24).
pub const GUEST_PREFIX: u8 = 24;

/// A TCP port on the host's loopback that the guest may reach: the guest
/// connects to [`FORWARD_ADDR`]`:guest_port`, and the connection is relayed
/// to `127.0.0.1:host_port`. Nothing else is reachable (qemu's `restrict=on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostForward {
    /// The port the guest connects to on [`FORWARD_ADDR`].
    pub guest_port: u16,
    /// The port on the host's 127.0.0.1 the connection goes to.
    pub host_port: u16,
}

impl HostForward {
    /// A forward from `FORWARD_ADDR:guest_port` to `127.0.0.1:host_port`.
    pub fn new(guest_port: u16, host_port: u16) -> Self {
        HostForward {
            guest_port,
            host_port,
        }
    }

    /// Where the guest connects.
    pub fn guest_addr(self) -> SocketAddrV4 {
        SocketAddrV4::new(FORWARD_ADDR, self.guest_port)
    }

    /// Where the host side connects.
    pub fn host_addr(self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.host_port)
    }
}

impl fmt::Display for HostForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.guest_port, self.host_port)
    }
}

impl FromStr for HostForward {
    type Err = Error;

    /// `GUEST:HOST` ports, or one port for both.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::BadForward(s.to_owned());
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|&p| p != 0);
        match s.split_once(':') {
            Some((g, h)) => Ok(HostForward::new(
                port(g).ok_or_else(bad)?,
                port(h).ok_or_else(bad)?,
            )),
            None => {
                let p = port(s).ok_or_else(bad)?;
                Ok(HostForward::new(p, p))
            }
        }
    }
}

/// The qemu arguments for a user-mode NIC that reaches only `forwards`:
/// `restrict=on` cuts the guest off from everything but the `guestfwd`
/// rules, and each rule's `cmd:` makes qemu spawn `relay 127.0.0.1:PORT`
/// once per guest connection, with the connection as its stdin and stdout.
/// `exposes` become `hostfwd` rules, which `restrict=on` leaves working:
/// they are connections the host opens.
pub fn netdev_args(forwards: &[HostForward], exposes: &[GuestExpose], relay: &Path) -> Vec<String> {
    let mut netdev = "user,id=vmtest0,restrict=on".to_owned();
    for e in exposes {
        netdev.push_str(&format!(
            ",hostfwd=tcp:{}:{}-{GUEST_ADDR}:{}",
            e.host.ip(),
            e.host.port(),
            e.guest_port
        ));
    }
    for f in forwards {
        // qemu's option syntax doubles commas inside a value; the command is
        // split by glib's shell-style parser, hence the quoting.
        let cmd = format!(
            "{} {}",
            initramfs::shell_quote(&relay.display().to_string()),
            f.host_addr()
        )
        .replace(',', ",,");
        netdev.push_str(&format!(",guestfwd=tcp:{}-cmd:{cmd}", f.guest_addr()));
    }
    vec![
        "-netdev".into(),
        netdev,
        "-device".into(),
        // romfile=: no PXE option ROM; -kernel boots never use it, and
        // loading it costs time and needs ipxe-qemu installed.
        "virtio-net-pci,netdev=vmtest0,romfile=".into(),
    ]
}

/// qemu's accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Software emulation: slow, works everywhere.
    Tcg,
    /// Hardware virtualisation, used only when a probe boot succeeded.
    Kvm,
}

impl Accel {
    /// The name qemu uses.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Tcg => "tcg",
            Accel::Kvm => "kvm",
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Accel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "tcg" => Ok(Accel::Tcg),
            "kvm" => Ok(Accel::Kvm),
            other => Err(Error::UnknownAccel(other.to_owned())),
        }
    }
}

/// A TCP port of the guest that the host may reach (qemu's `hostfwd`):
/// connections to `host` on the host go to [`GUEST_ADDR`]`:guest_port`.
/// The other direction from [`HostForward`]: what lets an API server on
/// the host reach a kubelet in the guest. `host`'s address must be one of
/// the host's own (qemu binds it); make it a loopback address: slirp shows
/// the guest a loopback peer as its gateway (10.0.2.2), any other peer
/// as itself, which a guest without a default route cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuestExpose {
    /// Where qemu listens on the host.
    pub host: SocketAddrV4,
    /// The guest's port the connections go to.
    pub guest_port: u16,
}

impl fmt::Display for GuestExpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.guest_port)
    }
}

impl FromStr for GuestExpose {
    type Err = Error;

    /// `HOST_ADDR:HOST_PORT:GUEST_PORT`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::BadForward(s.to_owned());
        let (host, guest) = s.rsplit_once(':').ok_or_else(bad)?;
        let host: SocketAddrV4 = host.parse().map_err(|_| bad())?;
        let guest_port = guest.parse::<u16>().ok().filter(|&p| p != 0);
        match guest_port {
            Some(guest_port) if host.port() != 0 => Ok(GuestExpose { host, guest_port }),
            _ => Err(bad()),
        }
    }
}

/// One guest boot: which kernel, which LSM list, what to put in the guest
/// and what to run.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// The kernel to boot.
    pub kernel: Kernel,
    /// The LSM list to boot with.
    pub lsm: LsmMode,
    /// Host binaries, placed at `/bin/NAME` with their shared libraries.
    pub binaries: Vec<PathBuf>,
    /// `(host, guest)` files or directories copied into the initramfs.
    pub files: Vec<(PathBuf, PathBuf)>,
    /// Environment variables for the command.
    pub env: Vec<(String, String)>,
    /// The command and its arguments, run by the guest's shell from `/`.
    pub command: Vec<String>,
    /// Hard limit for the whole boot; qemu is killed when it expires.
    pub timeout: Duration,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Extra qemu arguments, appended last.
    pub extra_qemu_args: Vec<String>,
    /// TCP ports on the host's loopback the guest may reach (and nothing
    /// else). When non-empty the guest gets a virtio NIC: its driver
    /// modules are extracted from the kernel's package into the initramfs,
    /// `eth0` is [`GUEST_ADDR`]`/24`, and each forward is reached at
    /// [`FORWARD_ADDR`]`:guest_port`. Empty: no NIC at all, and the boot
    /// is exactly as fast as before.
    pub host_forwards: Vec<HostForward>,
    /// The relay program qemu runs per forwarded connection; `None` finds
    /// `vmtest-relay` with [`relay::locate`](crate::relay::locate).
    pub relay: Option<PathBuf>,
    /// Guest ports the host may reach (qemu's `hostfwd`). Non-empty also
    /// gives the guest its NIC, as [`host_forwards`](Self::host_forwards) does.
    pub exposes: Vec<GuestExpose>,
    /// Kernel modules (with their dependencies, from the kernel's package)
    /// loaded before the command runs.
    pub modules: Vec<String>,
    /// Where the run's files go (the initramfs, `console.log`, `output.log`
    /// with the command's output as it is written, `qemu.log`, and
    /// `qemu.pid`), kept after the run; `None`: a temporary directory,
    /// removed. A long-running guest (a Kubernetes node) is watched and
    /// stopped through them.
    pub run_dir: Option<PathBuf>,
}

impl VmSpec {
    /// A spec with the default timeout and memory and nothing extra in the guest.
    pub fn new(kernel: Kernel, lsm: LsmMode, command: Vec<String>) -> Self {
        VmSpec {
            kernel,
            lsm,
            binaries: Vec::new(),
            files: Vec::new(),
            env: Vec::new(),
            command,
            timeout: DEFAULT_TIMEOUT,
            memory_mib: DEFAULT_MEMORY_MIB,
            extra_qemu_args: Vec::new(),
            host_forwards: Vec::new(),
            relay: None,
            exposes: Vec::new(),
            modules: Vec::new(),
            run_dir: None,
        }
    }

    /// Whether the guest gets a NIC: it has forwards or exposed ports.
    pub fn has_network(&self) -> bool {
        !self.host_forwards.is_empty() || !self.exposes.is_empty()
    }
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// What a guest boot produced.
#[derive(Debug, Clone, Serialize)]
pub struct VmOutcome {
    /// The command's exit status (`128 + N` when killed by signal N, as the
    /// shell reports it; 127 when not found).
    pub exit_code: i32,
    /// The command's stdout and stderr, merged in write order; exact unless
    /// the bytes are not UTF-8 (then lossily decoded, see `output_bytes`).
    pub output: String,
    /// The exact bytes of `output`.
    #[serde(skip)]
    pub output_bytes: Vec<u8>,
    /// The guest's active LSM list, from `/sys/kernel/security/lsm`.
    pub guest_lsm: Option<String>,
    /// The serial console: the kernel log and the init's sentinel lines.
    pub console: String,
    /// Wall time from starting qemu to its exit.
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// The accelerator used.
    pub accel: Accel,
}

/// The part of an outcome read from the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The exit status carried by the success sentinel.
    pub exit_code: i32,
    /// The guest's LSM list, if the init reported one.
    pub guest_lsm: Option<String>,
}

/// How a qemu process ended, as far as classification cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QemuEnd {
    /// qemu exited by itself, with this status description.
    Exited(String),
    /// The timeout expired and qemu was killed.
    TimedOut(Duration),
}

/// Reads the console of a finished boot: the success sentinel wins; else a
/// timeout, a panic, a setup failure or "no sentinel", in that order.
/// A sentinel is only trusted whole (`EXIT <n> END`), so a console cut off
/// mid-line never yields a wrong exit code.
pub fn classify(
    nonce: &str,
    console: &str,
    qemu_stderr: &str,
    end: &QemuEnd,
    output: &str,
) -> Result<Report> {
    let prefix = sentinel_prefix(nonce);
    let mut exit_code = None;
    let mut guest_lsm = None;
    let mut setup_failure = None;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        let Some(at) = line.find(&prefix) else {
            continue;
        };
        let rest = &line[at + prefix.len()..];
        if let Some(lsm) = rest.strip_prefix(" LSM ") {
            let lsm = lsm.trim();
            guest_lsm = (!lsm.is_empty()).then(|| lsm.to_owned());
        } else if rest == " LSM" {
            guest_lsm = None;
        } else if let Some(code) = rest
            .strip_prefix(" EXIT ")
            .and_then(|r| r.strip_suffix(" END"))
        {
            if let Ok(code) = code.trim().parse::<i32>() {
                exit_code = Some(code);
            }
        } else if let Some(step) = rest.strip_prefix(" SETUP-FAILED ") {
            setup_failure = Some(step.trim().to_owned());
        }
    }
    if let Some(exit_code) = exit_code {
        return Ok(Report {
            exit_code,
            guest_lsm,
        });
    }
    let console_tail = tail(console, TAIL_LINES);
    if let QemuEnd::TimedOut(timeout) = end {
        return Err(Error::Timeout {
            timeout: *timeout,
            console_tail,
            output: output.to_owned(),
        });
    }
    if let Some(line) = console.lines().find(|l| l.contains("Kernel panic")) {
        return Err(Error::KernelPanic {
            panic_line: line.trim_end_matches('\r').trim().to_owned(),
            console_tail,
        });
    }
    if let Some(step) = setup_failure {
        return Err(Error::GuestSetup { step, console_tail });
    }
    let status = match end {
        QemuEnd::Exited(s) => s.clone(),
        QemuEnd::TimedOut(_) => "killed".to_owned(),
    };
    Err(Error::NoSentinel {
        status,
        stderr_tail: tail(qemu_stderr, 10),
        console_tail,
    })
}

/// The qemu command line (without the program name). `relay` is the relay
/// program for `spec.host_forwards` (see [`netdev_args`]); when it is `None`
/// the bare name `vmtest-relay` is used, which qemu looks up on `$PATH`.
pub fn qemu_args(
    spec: &VmSpec,
    accel: Accel,
    initrd: &Path,
    console: &Path,
    output: &Path,
    relay: Option<&Path>,
) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-machine".into(),
        "q35".into(),
        "-accel".into(),
        accel.name().into(),
    ];
    if accel == Accel::Kvm {
        args.extend(["-cpu".into(), "host".into()]);
    }
    args.extend([
        "-m".into(),
        spec.memory_mib.to_string(),
        "-smp".into(),
        GUEST_CPUS.to_string(),
        // No default NIC, VGA or monitor: the guest gets exactly what is
        // listed here and in `extra_qemu_args`.
        "-nodefaults".into(),
        "-nographic".into(),
        "-no-reboot".into(),
        "-kernel".into(),
        spec.kernel.vmlinuz.display().to_string(),
        "-initrd".into(),
        initrd.display().to_string(),
        "-append".into(),
        kernel_cmdline(spec.lsm),
        // ttyS0: the console; ttyS1: the command's raw output.
        "-serial".into(),
        format!("file:{}", console.display()),
        "-serial".into(),
        format!("file:{}", output.display()),
    ]);
    if spec.has_network() {
        let relay = relay.unwrap_or(Path::new(crate::relay::RELAY_BIN));
        args.extend(netdev_args(&spec.host_forwards, &spec.exposes, relay));
    }
    args.extend(spec.extra_qemu_args.iter().cloned());
    args
}

/// A per-run tag for sentinel lines: unique per process and run, and
/// unpredictable enough that no kernel message or earlier run matches it.
fn nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{:x}{n:x}", nanos as u64, std::process::id())
}

/// Kills qemu if the run is abandoned early (error or panic in the harness).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The accelerator for this process: `VMTEST_ACCEL` when set, else KVM if a
/// probe boot of `kernel` under KVM succeeds, else TCG. The probe runs once
/// per process; machines where `/dev/kvm` exists but guests die with a KVM
/// internal error are thus detected instead of assumed.
pub fn accel_for(kernel: &Kernel) -> Result<Accel> {
    if let Some(forced) = std::env::var("VMTEST_ACCEL").ok().filter(|v| !v.is_empty()) {
        return forced.parse();
    }
    static ACCEL: OnceLock<Accel> = OnceLock::new();
    Ok(*ACCEL.get_or_init(|| probe_kvm(kernel)))
}

fn probe_kvm(kernel: &Kernel) -> Accel {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        tracing::info!("no usable /dev/kvm; using TCG");
        return Accel::Tcg;
    }
    let mut spec = VmSpec::new(kernel.clone(), LsmMode::Bpf, vec!["true".into()]);
    // A working KVM boots this in about a second; a broken one either
    // aborts at once or hangs, and the hang must not cost a full timeout.
    spec.timeout = Duration::from_secs(20);
    spec.memory_mib = 256;
    match run_with_accel(&spec, Accel::Kvm) {
        Ok(o) if o.exit_code == 0 => {
            tracing::info!(
                secs = o.duration.as_secs_f64(),
                "KVM probe boot succeeded; using KVM"
            );
            Accel::Kvm
        }
        Ok(o) => {
            tracing::info!(exit = o.exit_code, "KVM probe command failed; using TCG");
            Accel::Tcg
        }
        Err(e) => {
            tracing::debug!(error = %e, "KVM probe boot failed");
            tracing::info!(error = %e.label(), "KVM probe boot failed; using TCG");
            Accel::Tcg
        }
    }
}

/// Boots `spec` and runs its command, with the accelerator from [`accel_for`].
pub fn run(spec: &VmSpec) -> Result<VmOutcome> {
    let accel = accel_for(&spec.kernel)?;
    run_with_accel(spec, accel)
}

/// Boots `spec` with an explicit accelerator.
pub fn run_with_accel(spec: &VmSpec, accel: Accel) -> Result<VmOutcome> {
    // A kept run directory, or a temporary one that goes with `_temp`.
    let (_temp, work) = match &spec.run_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("creating run dir", dir, e))?;
            (None, dir.clone())
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("vmtest-")
                .tempdir()
                .map_err(|e| Error::io("creating run dir", std::env::temp_dir(), e))?;
            let path = temp.path().to_owned();
            (Some(temp), path)
        }
    };
    let nonce = nonce();
    // The NIC's modules and the relay only when there are forwards: other
    // boots stay exactly as they were.
    let (nic_modules, relay) = if !spec.has_network() {
        (None, None)
    } else {
        (
            Some(modules::nic_modules(&spec.kernel)?),
            Some(crate::relay::locate(spec.relay.as_deref())?),
        )
    };
    let initrd = initramfs::build(
        work.as_path(),
        &nonce,
        &Contents {
            binaries: &spec.binaries,
            files: &spec.files,
            env: &spec.env,
            command: &spec.command,
            nic_modules: nic_modules.as_deref(),
            extra_modules: &modules::extra_modules(&spec.kernel, &spec.modules)?,
        },
    )?;
    let console = work.as_path().join("console.log");
    let output = work.as_path().join("output.log");
    let qemu_log = work.as_path().join("qemu.log");
    let args = qemu_args(spec, accel, &initrd, &console, &output, relay.as_deref());
    let log = File::create(&qemu_log).map_err(|e| Error::io("creating qemu log", &qemu_log, e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::io("creating qemu log", &qemu_log, e))?;
    tracing::debug!(?args, "starting qemu");
    let started = Instant::now();
    let child = Command::new("qemu-system-x86_64")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(|e| Error::Tool {
            tool: "qemu-system-x86_64".to_owned(),
            status: format!("could not start: {e}"),
            output_tail: String::new(),
        })?;
    if spec.run_dir.is_some() {
        let pid_file = work.join("qemu.pid");
        std::fs::write(&pid_file, format!("{}\n", child.id()))
            .map_err(|e| Error::io("writing", &pid_file, e))?;
    }
    let mut child = KillOnDrop(child);
    let deadline = started + spec.timeout;
    let end = loop {
        match child.0.try_wait() {
            Ok(Some(status)) => break QemuEnd::Exited(describe_status(&status)),
            Ok(None) => {}
            Err(e) => {
                return Err(Error::Tool {
                    tool: "qemu-system-x86_64".to_owned(),
                    status: format!("wait failed: {e}"),
                    output_tail: String::new(),
                })
            }
        }
        if Instant::now() >= deadline {
            let _ = child.0.kill();
            let _ = child.0.wait();
            break QemuEnd::TimedOut(spec.timeout);
        }
        if accel == Accel::Kvm {
            // On a KVM internal error qemu pauses the guest and keeps
            // running; waiting for the timeout would waste it.
            let log = read_lossy(&qemu_log);
            if let Some(line) = log.lines().find(|l| l.contains("KVM internal error")) {
                return Err(Error::Kvm {
                    message: line.to_owned(),
                });
            }
        }
        std::thread::sleep(POLL);
    };
    let duration = started.elapsed();
    let console_text = read_lossy(&console);
    let output_bytes = std::fs::read(&output).unwrap_or_default();
    let output_text = String::from_utf8_lossy(&output_bytes).into_owned();
    let report = classify(
        &nonce,
        &console_text,
        &read_lossy(&qemu_log),
        &end,
        &output_text,
    )?;
    Ok(VmOutcome {
        exit_code: report.exit_code,
        output: output_text,
        output_bytes,
        guest_lsm: report.guest_lsm,
        console: console_text,
        duration,
        accel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::KernelSeries;

    const BOOT_OK: &str = "\
[    0.000000] Linux version 6.1.0-50-cloud-amd64 #1 SMP Debian 6.1.176-1\r
VMTEST-n1 LSM lockdown,capability,landlock,yama,apparmor,bpf\r
[    2.1] random: crng init done\r
VMTEST-n1 EXIT 3 END\r
[    2.5] reboot: Restarting system\r
";

    fn exited() -> QemuEnd {
        QemuEnd::Exited("exit 0".into())
    }

    #[test]
    fn sentinel_parsed() {
        let r = classify("n1", BOOT_OK, "", &exited(), "").unwrap();
        assert_eq!(r.exit_code, 3);
        assert_eq!(
            r.guest_lsm.as_deref(),
            Some("lockdown,capability,landlock,yama,apparmor,bpf")
        );
        assert!(lsm_list_has_bpf(r.guest_lsm.as_deref().unwrap()));
    }

    #[test]
    fn other_nonce_ignored() {
        let err = classify("n2", BOOT_OK, "", &exited(), "").unwrap_err();
        assert!(matches!(err, Error::NoSentinel { .. }), "{err}");
    }

    #[test]
    fn sentinel_after_kernel_noise_on_same_line() {
        let console = "[ 1.0] audit: x VMTEST-n1 EXIT 0 END\n";
        assert_eq!(
            classify("n1", console, "", &exited(), "")
                .unwrap()
                .exit_code,
            0
        );
    }

    #[test]
    fn panic_console() {
        let console = "\
[    1.2] Run /init as init process
[    1.3] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100
[    1.3] CPU: 0 PID: 1 Comm: init Not tainted 6.1.0-50-cloud-amd64 #1
[    1.3] Rebooting in 1 seconds..
";
        match classify("n1", console, "", &exited(), "").unwrap_err() {
            Error::KernelPanic {
                panic_line,
                console_tail,
            } => {
                assert!(panic_line
                    .starts_with("[    1.3] Kernel panic - not syncing: Attempted to kill init!"));
                assert!(console_tail.contains("Rebooting"));
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn truncated_console() {
        // Cut off in the middle of the sentinel: no exit code is trusted.
        let console = "VMTEST-n1 LSM lockdown,capability\nVMTEST-n1 EXIT 1";
        let err = classify("n1", console, "qemu: terminated", &exited(), "").unwrap_err();
        match err {
            Error::NoSentinel {
                stderr_tail,
                console_tail,
                ..
            } => {
                assert_eq!(stderr_tail, "qemu: terminated");
                assert!(console_tail.ends_with("VMTEST-n1 EXIT 1"));
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn timeout_and_setup_failure() {
        let end = QemuEnd::TimedOut(Duration::from_secs(2));
        let err = classify("n1", "[ 0.1] booting\n", "", &end, "partial").unwrap_err();
        assert!(
            matches!(&err, Error::Timeout { output, .. } if output == "partial"),
            "{err}"
        );
        assert_eq!(err.label(), "timeout");
        let console = "VMTEST-n1 SETUP-FAILED mount bpffs\n";
        let err = classify("n1", console, "", &exited(), "").unwrap_err();
        assert!(
            matches!(&err, Error::GuestSetup { step, .. } if step == "mount bpffs"),
            "{err}"
        );
    }

    #[test]
    fn empty_lsm_is_none() {
        let console = "VMTEST-n1 LSM \nVMTEST-n1 EXIT 0 END\n";
        assert_eq!(
            classify("n1", console, "", &exited(), "")
                .unwrap()
                .guest_lsm,
            None
        );
    }

    #[test]
    fn cmdline_per_mode() {
        assert_eq!(
            kernel_cmdline(LsmMode::Bpf),
            "console=ttyS0 panic=-1 softlockup_panic=1 lsm=lockdown,capability,landlock,yama,apparmor,bpf quiet"
        );
        assert_eq!(
            kernel_cmdline(LsmMode::NoBpf),
            "console=ttyS0 panic=-1 softlockup_panic=1 lsm=lockdown,capability,landlock,yama quiet"
        );
        assert!(!lsm_list_has_bpf(LsmMode::NoBpf.lsm_list()));
        assert!(lsm_list_has_bpf(LsmMode::Bpf.lsm_list()));
        assert!(!lsm_list_has_bpf("lockdown,capability,bpfx"));
        assert_eq!("nobpf".parse::<LsmMode>().unwrap(), LsmMode::NoBpf);
        assert!("selinux".parse::<LsmMode>().is_err());
        assert_eq!(parse_lsm_list("bpf,nobpf").unwrap(), LsmMode::ALL.to_vec());
    }

    #[test]
    fn qemu_command_line() {
        let kernel = Kernel {
            series: KernelSeries::V6_1,
            version: "6.1.0-50-cloud-amd64".into(),
            package: "linux-image-6.1.0-50-cloud-amd64".into(),
            package_version: "6.1.176-1".into(),
            vmlinuz: PathBuf::from("/c/vmlinuz"),
        };
        let mut spec = VmSpec::new(kernel, LsmMode::NoBpf, vec!["true".into()]);
        spec.extra_qemu_args = vec!["-nic".into(), "user,restrict=on".into()];
        let args = qemu_args(
            &spec,
            Accel::Tcg,
            Path::new("/w/i"),
            Path::new("/w/c"),
            Path::new("/w/o"),
            None,
        );
        let joined = args.join(" ");
        assert!(joined.starts_with("-machine q35 -accel tcg -m 1024 -smp 2 "));
        assert!(joined.contains("-no-reboot -kernel /c/vmlinuz -initrd /w/i -append"));
        assert!(joined.contains("-serial file:/w/c -serial file:/w/o -nic user,restrict=on"));
        assert!(args.contains(&kernel_cmdline(LsmMode::NoBpf)));
        let kvm = qemu_args(
            &spec,
            Accel::Kvm,
            Path::new("/i"),
            Path::new("/c"),
            Path::new("/o"),
            None,
        );
        assert!(kvm.join(" ").contains("-accel kvm -cpu host"));
        assert!(!joined.contains("-netdev"), "no NIC without forwards");
        assert_eq!("kvm".parse::<Accel>().unwrap(), Accel::Kvm);
        assert!("hvf".parse::<Accel>().is_err());
    }

    #[test]
    fn host_forwards() {
        assert_eq!(
            "6443:34567".parse::<HostForward>().unwrap(),
            HostForward::new(6443, 34567)
        );
        assert_eq!(
            "80".parse::<HostForward>().unwrap(),
            HostForward::new(80, 80)
        );
        for bad in ["", "0", "1:0", "x:1", "1:2:3", "70000"] {
            assert!(bad.parse::<HostForward>().is_err(), "{bad}");
        }
        let f = HostForward::new(6443, 34567);
        assert_eq!(f.guest_addr().to_string(), "10.0.2.100:6443");
        assert_eq!(f.host_addr().to_string(), "127.0.0.1:34567");

        let args = netdev_args(
            &[f, HostForward::new(80, 8080)],
            &[],
            Path::new("/t/a,b c/vmtest-relay"),
        );
        assert_eq!(
            args,
            [
                "-netdev",
                "user,id=vmtest0,restrict=on\
                 ,guestfwd=tcp:10.0.2.100:6443-cmd:'/t/a,,b c/vmtest-relay' 127.0.0.1:34567\
                 ,guestfwd=tcp:10.0.2.100:80-cmd:'/t/a,,b c/vmtest-relay' 127.0.0.1:8080",
                "-device",
                "virtio-net-pci,netdev=vmtest0,romfile=",
            ]
        );
    }

    #[test]
    fn guest_exposes() {
        let e: GuestExpose = "127.0.0.1:20250:10250".parse().unwrap();
        assert_eq!(e.host.to_string(), "127.0.0.1:20250");
        assert_eq!(e.guest_port, 10250);
        assert_eq!(e.to_string(), "127.0.0.1:20250:10250");
        for bad in [
            "",
            "10250",
            "1:2",
            "10.0.0.1:0:1",
            "10.0.0.1:1:0",
            "x:1:2",
            "::1:1:2",
        ] {
            assert!(bad.parse::<GuestExpose>().is_err(), "{bad}");
        }
        // Only exposes: still a NIC, hostfwd rules and no guestfwd.
        let args = netdev_args(&[], &[e], Path::new("/r"));
        assert_eq!(
            args[1],
            "user,id=vmtest0,restrict=on,hostfwd=tcp:127.0.0.1:20250-10.0.2.15:10250"
        );
        let kernel = Kernel {
            series: KernelSeries::V6_12,
            version: "6.12.117+deb13-cloud-amd64".into(),
            package: "linux-image-6.12.117+deb13-cloud-amd64".into(),
            package_version: "6.12.117-1".into(),
            vmlinuz: PathBuf::from("/c/vmlinuz"),
        };
        let mut spec = VmSpec::new(kernel, LsmMode::Bpf, vec!["true".into()]);
        assert!(!spec.has_network());
        spec.exposes = vec![e];
        assert!(spec.has_network());
        let joined = qemu_args(
            &spec,
            Accel::Tcg,
            Path::new("/i"),
            Path::new("/c"),
            Path::new("/o"),
            None,
        )
        .join(" ");
        assert!(
            joined.contains("hostfwd=tcp:127.0.0.1:20250-10.0.2.15:10250"),
            "{joined}"
        );
    }

    #[test]
    fn qemu_command_line_with_forwards() {
        let kernel = Kernel {
            series: KernelSeries::V6_12,
            version: "6.12.117+deb13-cloud-amd64".into(),
            package: "linux-image-6.12.117+deb13-cloud-amd64".into(),
            package_version: "6.12.117-1".into(),
            vmlinuz: PathBuf::from("/c/vmlinuz"),
        };
        let mut spec = VmSpec::new(kernel, LsmMode::Bpf, vec!["true".into()]);
        spec.host_forwards = vec![HostForward::new(6443, 4000)];
        spec.extra_qemu_args = vec!["-S".into()];
        let relay = Path::new("/r/vmtest-relay");
        let args = qemu_args(
            &spec,
            Accel::Tcg,
            Path::new("/i"),
            Path::new("/c"),
            Path::new("/o"),
            Some(relay),
        );
        let joined = args.join(" ");
        // The NIC comes before the caller's extra arguments, so they can
        // still add to or override it.
        assert!(
            joined.ends_with(
                "-serial file:/o -netdev user,id=vmtest0,restrict=on,guestfwd=tcp:10.0.2.100:6443-cmd:/r/vmtest-relay 127.0.0.1:4000 -device virtio-net-pci,netdev=vmtest0,romfile= -S"
            ),
            "{joined}"
        );
        let bare = qemu_args(
            &spec,
            Accel::Tcg,
            Path::new("/i"),
            Path::new("/c"),
            Path::new("/o"),
            None,
        );
        assert!(bare.join(" ").contains("-cmd:vmtest-relay 127.0.0.1:4000"));
    }
}
