"""The lib64 workload image's choice of glibc files from Debian's libc6 package list (pure)."""

from harness.image.lib64 import glibc_paths

LIBC6_LIST = """\
/.
/etc/ld.so.conf.d/x86_64-linux-gnu.conf
/lib/x86_64-linux-gnu
/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
/lib/x86_64-linux-gnu/libc.so.6
/lib/x86_64-linux-gnu/libmemusage.so
/lib/x86_64-linux-gnu/libnss_dns.so.2
/usr/lib/x86_64-linux-gnu/gconv/UTF-16.so
/usr/lib/x86_64-linux-gnu/libsomething.so.1.2
/usr/share/doc/libc6/copyright
/lib64/ld-linux-x86-64.so.2
"""


def test_the_shared_objects_directly_in_the_multiarch_libdirs_are_taken() -> None:
    assert glibc_paths(LIBC6_LIST) == [
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libmemusage.so",
        "/lib/x86_64-linux-gnu/libnss_dns.so.2",
        "/usr/lib/x86_64-linux-gnu/libsomething.so.1.2",
    ]
