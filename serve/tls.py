"""TLS of the gRPC port: the settings' certificate chain, key and client CA, read again at the first handshake after
one of them changed, so a rotated certificate (cert-manager, a renewed Kubernetes Secret) is served without a
restart. A new chain and key that do not match (one file replaced, the other not yet), or a client CA file that holds no
PEM certificate, are left until they are usable: the old ones serve meanwhile."""

import logging
import os
import ssl
from pathlib import Path

import grpc
from edgedistill.serve.settings import Settings, SettingsError

log = logging.getLogger("serve")
TLS_FILES = "a PEM certificate chain and its key, unencrypted, and CA certificates in PEM, as gRPC takes them"


def check_pem(chain: Path | None, key: Path | None, ca: Path | None) -> None:
    """`ssl.SSLError` (an `OSError`, as for a file that cannot be read) where the TLS files given are not `TLS_FILES`,
    naming the files at fault: gRPC itself would only fail to bind its port, or fail each handshake, naming none."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # the files' form and match alone: gRPC's own TLS judges key sizes
    try:
        if chain is not None:
            files = f"the certificate chain {chain} and its key {key or chain}"
            # An empty passphrase: OpenSSL would otherwise ask for one on the terminal.
            context.load_cert_chain(chain, key, password=lambda: b"")
        if ca is not None:
            files = f"the CA certificates {ca}"
            context.load_verify_locations(ca)
    except ssl.SSLError as err:  # given its code too: an SSLError of one argument reads as a tuple
        raise ssl.SSLError(err.errno, f"{files}: {err}") from None
    except OSError as err:  # a folder, a file that cannot be read
        raise OSError(err.errno, f"{files}: {err.strerror or err}") from None


class CertificateFiles:
    """The TLS files of `settings`; gRPC calls `fetch` before each handshake."""

    def __init__(self, settings: Settings):
        self.chain, self.key, self.ca = settings.tls_cert, settings.tls_key, settings.tls_ca
        self._problem = ""  # the last reason a change was not taken, logged once
        self._refused: tuple | None = None  # the stamp of files last found unusable: not read again until it changes
        try:
            self._stamp = self._stamp_now()
            self.initial = self._read()
        except (OSError, ssl.SSLError) as err:
            raise SettingsError(f"cannot use the TLS files ({TLS_FILES}): {err}") from err

    def _stamp_now(self) -> tuple[tuple[int, int, int, int], ...]:
        """What changes when a file is replaced, written or given other permissions: inode, times and size."""
        paths = (self.chain, self.key, *((self.ca,) if self.ca else ()))
        return tuple((s.st_ino, s.st_mtime_ns, s.st_ctime_ns, s.st_size) for s in map(os.stat, paths))

    def _read(self) -> grpc.ServerCertificateConfiguration:
        """The files' contents; `ssl.SSLError` where the key is not the chain's, or encrypted, or the CA file holds no
        certificate."""
        check_pem(self.chain, self.key, self.ca)
        ca = self.ca.read_bytes() if self.ca else None
        return grpc.ssl_server_certificate_configuration(
            [(self.key.read_bytes(), self.chain.read_bytes())], root_certificates=ca
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The files' new contents where they changed since last taken, else None (gRPC keeps what it has). Files
        found unusable are read again only once they change again: gRPC asks before every handshake."""
        stamp = None
        try:
            stamp = self._stamp_now()
            if stamp in (self._stamp, self._refused):
                return None
            config = self._read()
        except (OSError, ssl.SSLError) as err:
            self._refused = stamp
            if str(err) != self._problem:
                self._problem = str(err)
                log.warning(
                    "the TLS files changed but cannot be used, the previous ones keep serving: %s",
                    err,
                    extra={"event": "tls_reload_failed"},
                )
            return None
        self._stamp, self._refused, self._problem = stamp, None, ""
        log.info("the TLS files changed: new connections use them", extra={"event": "tls_reloaded"})
        return config


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """The gRPC port's TLS credentials (None: plaintext); client certificates required where `tls_ca` is set."""
    if settings.tls_cert is None:
        return None
    files = CertificateFiles(settings)
    return grpc.dynamic_ssl_server_credentials(
        files.initial, files.fetch, require_client_authentication=settings.tls_ca is not None
    )
