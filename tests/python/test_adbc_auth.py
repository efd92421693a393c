"""ADBC (unchanged) logs in to a Gyre coordinator over TLS with the test's own CA:
its `username`/`password` options reach Flight SQL's Handshake, and its
`tls_root_certs` option trusts the CA. Wrong or missing credentials run nothing.
With GYRE_JDBC_JAR (the Flight SQL JDBC driver), the JDBC driver's `user` and
`password` log in the same way (tests/java/FlightSqlLogin.java)."""
import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
import time

import adbc_driver_flightsql
import adbc_driver_flightsql.dbapi as flightsql
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca_and_cert(directory):
    """A CA, and a certificate it signs for localhost and 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gyre test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {name: os.path.join(directory, name) for name in ("ca.pem", "cert.pem", "key.pem")}
    with open(paths["ca.pem"], "wb") as f:
        f.write(pem(ca))
    with open(paths["cert.pem"], "wb") as f:
        f.write(pem(cert))
    with open(paths["key.pem"], "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return paths


def connect(uri, ca, username=None, password=None):
    kwargs = {adbc_driver_flightsql.DatabaseOptions.TLS_ROOT_CERTS.value: ca}
    if username is not None:
        kwargs["username"] = username
        kwargs["password"] = password
    return flightsql.connect(uri, db_kwargs=kwargs)


def count_workers(conn):
    with conn.cursor() as cur:
        cur.execute("select count(*) from gyre_workers()")
        return cur.fetchall()[0][0]


def refused(uri, ca, username=None, password=None):
    try:
        conn = connect(uri, ca, username, password)
        count_workers(conn)
    except flightsql.Error as e:
        return str(e)
    raise AssertionError(f"{username!r} got in without the right password")


def jdbc(jar, port, ca_path, user, password):
    """Runs a query through the JDBC driver; (exit code, output)."""
    here = os.path.dirname(os.path.abspath(__file__))
    program = os.path.join(here, "..", "java", "FlightSqlLogin.java")
    url = f"jdbc:arrow-flight-sql://localhost:{port}?useEncryption=true&tlsRootCerts={ca_path}"
    out = subprocess.run(
        ["java", "--add-opens=java.base/java.nio=org.apache.arrow.memory.core,ALL-UNNAMED",
         "-cp", jar, program, url, user, password, "select count(*) from gyre_workers()"],
        capture_output=True, text=True, timeout=300,
    )
    return out.returncode, out.stdout


def main():
    gyre = os.environ.get("GYRE_BIN", "target/release/gyre")
    with tempfile.TemporaryDirectory() as directory:
        paths = make_ca_and_cert(directory)
        line = subprocess.run(
            [gyre, "passwd", "alice"], input=b"correct horse\n", capture_output=True, check=True
        ).stdout
        users = os.path.join(directory, "users")
        with open(users, "wb") as f:
            f.write(line)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [gyre, "local", "--workers", "2", "--listen", f"127.0.0.1:{port}",
             "--users", users, "--tls-cert", paths["cert.pem"], "--tls-key", paths["key.pem"]],
            stdin=subprocess.DEVNULL,
        )
        try:
            with open(paths["ca.pem"]) as f:
                ca = f.read()
            uri = f"grpc+tls://localhost:{port}"
            deadline = time.time() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"gyre exited early with {proc.returncode}")
                try:
                    conn = connect(uri, ca, "alice", "correct horse")
                    assert count_workers(conn) == 2
                    break
                except flightsql.Error:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.5)
            with conn.cursor() as cur:
                cur.execute("create table t as select * from (values (1), (2)) as v(x)")
                cur.execute("select sum(x) from t")
                assert cur.fetchall() == [(3,)]
            conn.close()
            e = refused(uri, ca, "alice", "wrong")
            assert "wrong user name or password" in e, e
            e = refused(uri, ca)
            assert "log in" in e.lower() or "unauthenticated" in e.lower(), e
            passed = 1
            jar = os.environ.get("GYRE_JDBC_JAR")
            if jar:
                code, out = jdbc(jar, port, paths["ca.pem"], "alice", "correct horse")
                assert code == 0 and out.strip() == "2", out
                code, out = jdbc(jar, port, paths["ca.pem"], "alice", "wrong")
                assert code == 1 and "wrong user name or password" in out, out
                passed += 1
            print(f"Flight SQL login over TLS: {passed} passed, 0 failed")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
