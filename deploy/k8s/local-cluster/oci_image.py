#!/usr/bin/env python3
"""Write a one-layer OCI image archive from a directory, for `ctr images import`.

deploy/k8s/local-k8s builds its images with it: the local cluster has no
registry and no image builder. The archive is reproducible (sorted entries,
owner root, mtime 0), so an unchanged directory gives the same image digest.

usage: oci_image.py NAME:TAG OUT.tar ROOT_DIR [--entrypoint JSON] [--cmd JSON] [--env K=V]...
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def layer_of(root: str) -> bytes:
    """An uncompressed tar of ROOT's contents, entries sorted, owned by root."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, os.path.relpath(path, root))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return out.getvalue()


def digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def json_list(flag: str, text: str | None) -> list[str] | None:
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        sys.exit(f"oci_image.py: {flag} must be a JSON list of strings, got {text!r}.")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ref", help="image name with its tag, e.g. trainwarden.local/pause:3.10")
    parser.add_argument("out", help="the archive to write")
    parser.add_argument("root", help="the directory that becomes the image's file system")
    parser.add_argument("--entrypoint")
    parser.add_argument("--cmd")
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    if ":" not in args.ref.rsplit("/", 1)[-1]:
        sys.exit(f"oci_image.py: the image name {args.ref!r} has no tag; give NAME:TAG.")

    raw = layer_of(args.root)
    layer = gzip.compress(raw, mtime=0)
    config: dict = {"Env": [DEFAULT_PATH, *args.env], "WorkingDir": "/"}
    for key, flag in (("Entrypoint", "--entrypoint"), ("Cmd", "--cmd")):
        value = json_list(flag, getattr(args, key.lower()))
        if value is not None:
            config[key] = value
    image_config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [digest(raw)]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "deploy/k8s/local-cluster/oci_image.py"}],
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(image_config), "size": len(image_config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(layer), "size": len(layer)}],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": args.ref,
                        "org.opencontainers.image.ref.name": args.ref.rsplit(":", 1)[1],
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
    ).encode()
    with tarfile.open(args.out, "w") as tar:
        for name, blob in [
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", index),
            *((f"blobs/sha256/{hashlib.sha256(b).hexdigest()}", b) for b in (image_config, manifest, layer)),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    print(args.ref, digest(manifest))


if __name__ == "__main__":
    main()
