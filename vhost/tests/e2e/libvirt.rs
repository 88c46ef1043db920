//! Hira under a real libvirtd (Debian's `libvirt-daemon-system`, QEMU under TCG): the
//! QEMU hook (`hira-ctl libvirt-hook`, `deploy/libvirt/qemu`) adds each domain's VM
//! when the domain is prepared and removes it when it is released; the domain's XML
//! is the documented one (`deploy/libvirt/domain.xml`), booting a test image.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, bin_dir, ensure_built};

const HOOK: &str = "/etc/libvirt/hooks/qemu";

/// One test at a time owns libvirtd and its hook.
static LIBVIRTD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether this machine can run these tests, with the reason when not.
fn assert_can_run() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let have = Command::new("virsh").arg("--version").output().is_ok()
        && Path::new("/usr/sbin/libvirtd").exists();
    assert!(
        root && have,
        "needs root and libvirt (scripts/test installs libvirt-daemon-system and libvirt-daemon-driver-qemu)"
    );
}

/// This host's libvirtd.
const SYSTEM: &str = "qemu:///system";

fn virsh(args: &[&str]) -> std::process::Output {
    virsh_at(SYSTEM, args)
}

fn virsh_ok(args: &[&str]) -> String {
    virsh_ok_at(SYSTEM, args)
}

fn virsh_at(uri: &str, args: &[&str]) -> std::process::Output {
    Command::new("virsh")
        .arg("-c")
        .arg(uri)
        .args(args)
        .output()
        .expect("virsh runs")
}

fn virsh_ok_at(uri: &str, args: &[&str]) -> String {
    let o = virsh_at(uri, args);
    assert!(
        o.status.success(),
        "virsh -c {uri} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Waits until `done` holds, asking again on each change of what it reads; panics
/// with `what` after `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        // Polling a state libvirt offers no event for (domain states, hook effects).
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a process named `name` runs.
fn running(name: &str) -> bool {
    Command::new("pgrep")
        .args(["-x", name])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// libvirtd (and virtlogd) started afresh, so that they find the hook.
fn restart_libvirtd() {
    let _ = Command::new("pkill").args(["-x", "libvirtd"]).status();
    wait_for("the old libvirtd to exit", Duration::from_secs(30), || {
        !running("libvirtd")
    });
    if !running("virtlogd") {
        assert!(
            Command::new("virtlogd")
                .arg("-d")
                .status()
                .unwrap()
                .success()
        );
    }
    assert!(
        Command::new("libvirtd")
            .arg("-d")
            .status()
            .unwrap()
            .success()
    );
    wait_for("libvirtd to answer", Duration::from_secs(60), || {
        virsh(&["version"]).status.success()
    });
}

/// The hook for this test's build; removed (and libvirtd restarted without it) when
/// dropped.
struct Hook;

impl Hook {
    fn install() -> Hook {
        std::fs::create_dir_all("/etc/libvirt/hooks").unwrap();
        let ours = std::fs::read_to_string(crate::support::workspace().join("deploy/libvirt/qemu"))
            .unwrap();
        assert!(ours.contains("libvirt-hook"), "{ours}");
        // The packaged hook, told where this build's hira-ctl is.
        let script = ours.replace(
            "exec \"${HIRA_CTL:-/usr/bin/hira-ctl}\"",
            &format!(
                "HIRA_CTL={}\nexec \"$HIRA_CTL\"",
                bin_dir().join("hira-ctl").display()
            ),
        );
        std::fs::write(HOOK, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(HOOK, std::fs::Permissions::from_mode(0o755)).unwrap();
        restart_libvirtd();
        Hook
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(HOOK);
        restart_libvirtd();
    }
}

/// A domain as `deploy/libvirt/domain.xml` has it, booting `image` by its kernel,
/// its serial console into `console`.
struct Domain {
    name: String,
    console: PathBuf,
    window: PathBuf,
}

impl Domain {
    fn define(d: &Daemon, name: &str, vm: &str, cid: u32, share: u32, image: &Path) -> Domain {
        let shm = format!("hira-e2e-{}-{vm}", std::process::id());
        let window = PathBuf::from("/dev/shm").join(&shm);
        let socket = d.dir.path().join(format!("{vm}.vhost"));
        let console = d.dir.path().join(format!("{vm}.console"));
        let spec = format!(
            "socket={},cid={cid},window={},window-mb=64,share={share}",
            socket.display(),
            window.display()
        );
        let xml = format!(
            r#"<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <metadata>
    <hira:vm xmlns:hira='https://hira.dev/xmlns/libvirt/1' name='{vm}' spec='{spec}' control='{control}'/>
  </metadata>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{image}/vmlinuz</kernel>
    <initrd>{image}/initramfs.cpio.gz</initrd>
    <cmdline>console=ttyS0 quiet panic=-1</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <shmem name='{shm}'><model type='ivshmem-plain'/><size unit='M'>64</size></shmem>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-chardev'/>
    <qemu:arg value='socket,id=hira0,path={socket}'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='vhost-user-vsock-pci,chardev=hira0,addr=0x10'/>
  </qemu:commandline>
</domain>
"#,
            control = d.dir.path().join("control.sock").display(),
            image = image.display(),
            console = console.display(),
            socket = socket.display(),
        );
        let file = d.dir.path().join(format!("{name}.xml"));
        std::fs::write(&file, xml).unwrap();
        let _ = virsh(&["destroy", name]);
        let _ = virsh(&["undefine", name]);
        virsh_ok(&["define", file.to_str().unwrap()]);
        Domain {
            name: name.into(),
            console,
            window,
        }
    }

    fn state(&self) -> String {
        virsh_ok(&["domstate", &self.name]).trim().to_string()
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
        let _ = virsh(&["undefine", &self.name]);
        let _ = std::fs::remove_file(&self.window);
    }
}

fn vm_names(d: &Daemon) -> Vec<String> {
    let v: Value = serde_json::from_str(&d.ctl_ok(&["vm", "list", "--json"])).unwrap();
    v["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn libvirt_domains_get_hira_through_the_hook_and_leave_no_trace() {
    ensure_built();
    assert_can_run();
    let _libvirtd = LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    let d = Daemon::start_with(&["local"], &[], &["--socket-group", "libvirt-qemu"]);
    // QEMU's group reaches the guests' sockets, never the control socket.
    {
        use std::os::unix::fs::MetadataExt;
        let qemu_gid = nix::unistd::Group::from_name("libvirt-qemu")
            .unwrap()
            .unwrap()
            .gid
            .as_raw();
        let local = d.dir.path().join("local.sock").metadata().unwrap();
        assert_eq!((local.gid(), local.mode() & 0o777), (qemu_gid, 0o660));
        let control = d.dir.path().join("control.sock").metadata().unwrap();
        assert_eq!((control.gid(), control.mode() & 0o777), (0, 0o600));
    }
    let _hook = Hook::install();
    let pid = std::process::id();

    // One domain runs OpenCL programs, as natively, and is gone with its VM after.
    let programs = ["vecadd", "events"];
    let script = crate::vm::marked_script(&programs);
    let image = crate::vm::image_with("libvirt", &script, &programs);
    let a = Domain::define(&d, &format!("hira-e2e-{pid}-a"), "lva", 5, 1, &image);
    virsh_ok(&["start", &a.name]);
    wait_for("domain a to power off", Duration::from_secs(300), || {
        a.state() == "shut off"
    });
    let console = std::fs::read_to_string(&a.console).unwrap();
    let expected = crate::vm::marked_native(&programs);
    assert_eq!(
        crate::vm::guest_output(&console),
        expected,
        "{}",
        d.log_text()
    );
    wait_for("VM lva to be removed", Duration::from_secs(60), || {
        !vm_names(&d).contains(&"lva".to_string())
    });
    let ended = d.wait_idle(Duration::from_secs(60));
    let ours: Vec<_> = ended.iter().filter(|e| e["vm"] == "lva").collect();
    assert_eq!(ours.len(), 2, "{ended:?}");
    assert!(ours.iter().all(|e| e["data_plane"] == "rings"), "{ours:?}");
    assert!(!a.window.exists() && !d.dir.path().join("lva.vhost").exists());

    // Two at once, with different shares; destroyed, they leave nothing.
    // Each guest holds a session open without using the CPU (the program waits for
    // commands that never come), so that the two domains do not starve other tests.
    let long = crate::vm::image_with(
        "libvirt-idle",
        "sleep 600 | /hira/migrate 2>&1\n",
        &["migrate"],
    );
    let b = Domain::define(&d, &format!("hira-e2e-{pid}-b"), "lvb", 6, 1, &long);
    let c = Domain::define(&d, &format!("hira-e2e-{pid}-c"), "lvc", 7, 3, &long);
    virsh_ok(&["start", &b.name]);
    virsh_ok(&["start", &c.name]);
    let live =
        d.control(serde_json::json!({"cmd": "wait_live", "count": 2, "timeout_ms": 240_000}));
    assert_eq!(live["reached"], true, "{live}\n{}", d.log_text());
    let shares: Vec<(String, u64)> = live["status"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == "lvb" || v["name"] == "lvc")
        .map(|v| {
            (
                v["name"].as_str().unwrap().into(),
                v["share"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shares, [("lvb".into(), 1), ("lvc".into(), 3)]);
    virsh_ok(&["destroy", &b.name]);
    virsh_ok(&["destroy", &c.name]);
    wait_for(
        "VMs lvb and lvc to be removed",
        Duration::from_secs(60),
        || {
            let names = vm_names(&d);
            !names.contains(&"lvb".to_string()) && !names.contains(&"lvc".to_string())
        },
    );
    let status = d.status();
    assert!(
        status["sessions"].as_array().unwrap().is_empty(),
        "{status}"
    );
    for vm in ["lvb", "lvc"] {
        assert!(
            status["vms"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v["name"] != vm),
            "{status}"
        );
        assert!(!d.dir.path().join(format!("{vm}.vhost")).exists());
    }
    assert!(!b.window.exists() && !c.window.exists());
}

/// `scripts/quickstart --remove` when dropped: the quick start leaves nothing behind.
struct QuickStart;

impl QuickStart {
    fn remove() -> std::process::Output {
        Command::new(crate::support::workspace().join("scripts/quickstart"))
            .arg("--remove")
            .output()
            .unwrap()
    }
}

impl Drop for QuickStart {
    fn drop(&mut self) {
        let _ = Self::remove();
    }
}

/// The README's operator quick start, written down as `scripts/quickstart` (the README
/// test checks they agree), run on this machine: libvirt and the host's OpenCL, the
/// packages built and `hira-host` installed, its daemon started as its unit starts it,
/// libvirt's hook installed, a guest with the `hira-guest` package defined and started
/// with `virsh`. The guest's programs print what they print natively, and
/// `scripts/quickstart --remove` leaves no trace of any of it.
#[test]
fn the_operators_quick_start_runs_an_opencl_program_in_a_libvirt_domain() {
    ensure_built();
    assert_can_run();
    let _libvirtd = LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    // From nothing: what an interrupted run left goes first.
    let removed = QuickStart::remove();
    assert!(removed.status.success(), "{removed:?}");
    let quick = QuickStart;
    let out = Command::new(crate::support::workspace().join("scripts/quickstart"))
        // The guest kernel's packages, downloaded once for every VM test.
        .env("HIRA_VM_DEBS", bin_dir().join("hira-vm-debs"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string("/var/log/hira-vhost.log").unwrap_or_default()
    );
    // `hira-ctl status`: the packaged daemon's API servers see the device.
    assert!(stdout.contains("  opencl device: "), "{stdout}");
    // `hira-ctl list`, once the domain started: its VM, from the hook.
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some("hira-demo")),
        "{stdout}"
    );

    // What the guest ran (`clinfo -l; /hira/vecadd`), natively.
    let vendors = crate::support::Vendors::native();
    let native = |program: &Path, args: &[&str]| {
        let o = Command::new(program)
            .args(args)
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{program:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let expected =
        native(Path::new("clinfo"), &["-l"]) + &native(&crate::support::c_program("vecadd"), &[]);
    assert_eq!(crate::vm::guest_output(&stdout), expected);

    drop(quick);
    assert!(
        !Command::new("dpkg")
            .args(["-s", "hira-host"])
            .output()
            .unwrap()
            .status
            .success(),
        "hira-host is purged"
    );
    assert!(!virsh(&["dominfo", "hira-demo"]).status.success());
    for gone in [
        HOOK,
        "/run/hira",
        "/dev/shm/hira-demo",
        "/var/lib/libvirt/images/hira-demo",
        "/etc/hira",
        "/usr/libexec/hira",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left");
    }
    let packaged = Command::new("pgrep")
        .args(["-f", "^/usr/libexec/hira/hira-vhost"])
        .output()
        .unwrap();
    assert!(
        !packaged.status.success(),
        "the quick start's daemon stopped"
    );
}

/// A second "host" on this machine for libvirt: a mount namespace with its own
/// libvirt state, configuration (a host UUID of its own, so that libvirt migrates
/// between the two), `/dev/shm` and runtime directory, running its own virtlogd and
/// libvirtd. It shares everything else (the network, `/tmp`, the binaries). The
/// libvirt hook installed on this host when it starts is its hook too. Its daemons
/// and domains are gone when it is dropped.
struct OtherHost {
    work: tempfile::TempDir,
    libvirtd: u32,
    virtlogd: u32,
}

impl OtherHost {
    fn start() -> OtherHost {
        let work = tempfile::Builder::new()
            .prefix("hira-e2e-host-b")
            .tempdir_in("/var/tmp")
            .unwrap();
        let w = work.path();
        let sh = |script: &str| {
            let o = Command::new("sh").arg("-ec").arg(script).output().unwrap();
            assert!(o.status.success(), "{script}: {o:?}");
        };
        // Its own copy of /etc/libvirt without this host's domains.
        sh(&format!(
            "W={w}
mkdir -p $W/run $W/lib/qemu $W/cache $W/log/qemu $W/shm
chown libvirt-qemu:libvirt-qemu $W/lib/qemu && chmod 0750 $W/lib/qemu && chmod 1777 $W/shm
cp -a /etc/libvirt $W/etc
rm -f $W/etc/qemu/*.xml $W/etc/qemu/autostart/*
echo 'host_uuid = \"2b1f6a52-6c1e-4f1d-9a57-3f4f5c8e7d10\"' >> $W/etc/libvirtd.conf
# Domain ids restart at 1 here: no cgroups of their own, so none collide with ours.
echo 'cgroup_controllers = [ ]' >> $W/etc/qemu.conf",
            w = w.display()
        ));
        // The namespace lives as long as the daemons started in it.
        sh(&format!(
            "export W={w}
unshare --mount --propagation private sh -ec '
mount --bind $W/run /run/libvirt
mount --bind $W/lib /var/lib/libvirt
mount --bind $W/cache /var/cache/libvirt
mount --bind $W/log /var/log/libvirt
mount --bind $W/etc /etc/libvirt
mount --bind $W/shm /dev/shm
virtlogd -d -p $W/virtlogd.pid
libvirtd -d -p $W/libvirtd.pid
'",
            w = w.display()
        ));
        let pid = |f: &str| -> u32 {
            std::fs::read_to_string(w.join(f))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let host = OtherHost {
            libvirtd: pid("libvirtd.pid"),
            virtlogd: pid("virtlogd.pid"),
            work,
        };
        let uri = host.uri();
        wait_for(
            "the other libvirtd to answer",
            Duration::from_secs(60),
            || virsh_at(&uri, &["version"]).status.success(),
        );
        host
    }

    /// How virsh reaches its libvirtd.
    fn uri(&self) -> String {
        format!(
            "qemu+unix:///system?socket={}",
            self.work.path().join("run/libvirt-sock").display()
        )
    }

    /// Its mount namespace.
    fn mount_ns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/mnt", self.libvirtd))
    }
}

impl Drop for OtherHost {
    fn drop(&mut self) {
        let uri = self.uri();
        let names = virsh_at(&uri, &["list", "--name"]);
        for name in String::from_utf8_lossy(&names.stdout).split_whitespace() {
            let _ = virsh_at(&uri, &["destroy", name]);
        }
        for pid in [self.libvirtd, self.virtlogd] {
            // SAFETY: signals a daemon this host started.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            // Gone before its directories are removed (not our children: no pidfd
            // wait; their /proc entries say when).
            let deadline = Instant::now() + Duration::from_secs(30);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A domain using Hira that `virsh migrate` can move: on the `pc` machine, whose
/// root bus lets QEMU unplug Hira's device (id `hira0dev`) for the move; its window
/// with `role='master'`, so that QEMU migrates the window's contents (the rings);
/// its serial console on the FIFOs `console.in` and `console.out`. Without
/// `device`, only the character device for Hira's socket, as the domain arrives
/// at the target.
#[allow(clippy::too_many_arguments)]
fn movable_domain(
    name: &str,
    uuid: &str,
    vm: &str,
    spec: &str,
    control: &Path,
    image: &Path,
    console: &Path,
    socket: &Path,
    shm: &str,
    device: bool,
) -> String {
    let device = if device {
        "\n    <qemu:arg value='-device'/>\n    <qemu:arg value='vhost-user-vsock-pci,chardev=hira0,id=hira0dev,addr=0x10'/>"
    } else {
        ""
    };
    format!(
        r#"<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <metadata>
    <hira:vm xmlns:hira='https://hira.dev/xmlns/libvirt/1' name='{vm}' spec='{spec}' control='{control}'/>
  </metadata>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{image}/vmlinuz</kernel>
    <initrd>{image}/initramfs.cpio.gz</initrd>
    <cmdline>console=ttyS0 quiet panic=-1</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='pipe'><source path='{console}'/><target port='0'/></serial>
    <shmem name='{shm}' role='master'><model type='ivshmem-plain'/><size unit='M'>64</size></shmem>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-chardev'/>
    <qemu:arg value='socket,id=hira0,path={socket}'/>{device}
  </qemu:commandline>
</domain>
"#,
        control = control.display(),
        image = image.display(),
        console = console.display(),
        socket = socket.display(),
    )
}

/// Whether the domain's QEMU (at `uri`) has a device with id `id`.
fn has_device(uri: &str, domain: &str, id: &str) -> bool {
    let out = virsh_ok_at(
        uri,
        &[
            "qemu-monitor-command",
            domain,
            r#"{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}"#,
        ],
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    v["return"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == id)
}

/// `virsh migrate` of a domain whose guest runs a program through Hira, to another
/// libvirtd with its own Hira daemon, as docs/operating.md tells an operator: the
/// VM's sessions checkpointed at the source, Hira's device unplugged, the domain
/// migrated live (the hook adds its VM at the target and removes it at the source),
/// the sessions restored at the target, the device plugged there. The program goes
/// on where it was, and prints what it prints natively.
#[test]
fn virsh_migrate_moves_a_domain_and_its_hira_sessions_to_another_libvirtd() {
    ensure_built();
    assert_can_run();
    let _libvirtd = LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    let _hook = Hook::install();
    let b_host = OtherHost::start();
    let a = Daemon::start_with(&["local"], &[], &["--socket-group", "libvirt-qemu"]);
    let b = Daemon::start_in_mount_ns(
        &b_host.mount_ns(),
        &["local"],
        &["--socket-group", "libvirt-qemu"],
    );
    let script = ["step", "pend", "loop 2", "check", "end"];
    let expected = crate::migration::native(&script);
    let image = crate::vm::image_with(
        "libvirt-migrate",
        &crate::vm::MIGRATE_SCRIPT.replace("/hira/migrate", "HIRA_RESUME_SECS=600 /hira/migrate"),
        &["migrate"],
    );

    let pid = std::process::id();
    let (name, vm, shm) = (
        format!("hira-e2e-{pid}-m"),
        "lvm",
        format!("hira-e2e-{pid}-lvm"),
    );
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
    let work = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let side = |d: &Daemon, host: &str, device: bool| {
        let console = work.path().join(format!("console-{host}"));
        for end in ["in", "out"] {
            let fifo = format!("{}.{end}", console.display());
            nix::unistd::mkfifo(fifo.as_str(), nix::sys::stat::Mode::S_IRWXU).unwrap();
            use std::os::unix::fs::PermissionsExt;
            // QEMU opens them as its own user.
            std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        let socket = d.dir.path().join(format!("{vm}.vhost"));
        // The same window path on both hosts: each has its own /dev/shm.
        let spec = format!(
            "socket={},cid=5,window=/dev/shm/{shm},window-mb=64,share=1",
            socket.display()
        );
        let xml = movable_domain(
            &name,
            uuid.trim(),
            vm,
            &spec,
            &d.dir.path().join("control.sock"),
            &image,
            &console,
            &socket,
            &shm,
            device,
        );
        let file = work.path().join(format!("{host}.xml"));
        std::fs::write(&file, xml).unwrap();
        (file, console)
    };
    let (source_xml, source_console) = side(&a, "a", true);
    let (target_xml, target_console) = side(&b, "b", false);
    let _ = virsh(&["destroy", &name]);
    virsh_ok(&["create", source_xml.to_str().unwrap()]);
    let domain = Domain {
        name: name.clone(),
        console: source_console.clone(),
        window: PathBuf::from("/dev/shm").join(&shm),
    };
    let mut console = crate::vm::Console::fifos(&source_console);
    console.line_starting("ready");
    let mut got: Vec<String> = script[..2].iter().map(|c| console.ask(c)).collect();

    // 1. The VM's sessions, suspended into files (the program holds its calls).
    let sessions = work.path().join("sessions");
    a.ctl_ok(&["checkpoint", vm, sessions.to_str().unwrap()]);
    // 2. Hira's device leaves the VM: QEMU cannot migrate it.
    virsh_ok(&[
        "qemu-monitor-command",
        &name,
        r#"{"execute":"device_del","arguments":{"id":"hira0dev"}}"#,
    ]);
    wait_for(
        "the guest to release Hira's device",
        Duration::from_secs(60),
        || !has_device(SYSTEM, &name, "hira0dev"),
    );
    // 3. The domain moves, live; at the target, the hook adds its VM before QEMU
    //    starts; at the source, it removes it once QEMU is gone.
    let target = b_host.uri();
    virsh_ok(&[
        "migrate",
        "--live",
        "--xml",
        target_xml.to_str().unwrap(),
        &name,
        &target,
        "--migrateuri",
        "tcp://127.0.0.1",
    ]);
    assert_eq!(virsh_ok_at(&target, &["domstate", &name]).trim(), "running");
    wait_for(
        "VM lvm to leave the source's daemon",
        Duration::from_secs(60),
        || !vm_names(&a).contains(&vm.to_string()),
    );
    assert!(vm_names(&b).contains(&vm.to_string()));
    // 4. The sessions wait at the target's daemon; 5. the device joins the VM there.
    b.ctl_ok(&["restore", sessions.to_str().unwrap()]);
    virsh_ok_at(
        &target,
        &[
            "qemu-monitor-command",
            &name,
            r#"{"execute":"device_add","arguments":{"driver":"vhost-user-vsock-pci","chardev":"hira0","id":"hira0dev","addr":"0x10"}}"#,
        ],
    );
    let mut console = crate::vm::Console::fifos(&target_console);
    got.extend(script[2..].iter().map(|c| console.ask(c)));
    assert_eq!(got, expected, "target daemon's log:\n{}", b.log_text());
    assert_eq!(console.line_starting("=== exit"), "=== exit 0");
    let ended = b.wait_idle(Duration::from_secs(60));
    let ours: Vec<_> = ended.iter().filter(|e| e["vm"] == vm).collect();
    assert_eq!(ours.len(), 1, "{ended:?}");
    assert_eq!(ours[0]["data_plane"], "rings", "{ours:?}");
    assert!(a.status()["sessions"].as_array().unwrap().is_empty());
    drop(domain);
    drop(b_host);
}
