#!/usr/bin/env bash
# iproute2 for a machine that has none and cannot install packages (the lent GPU machines): the
# emulated cluster (`scaledl cluster`, the netns phase of check.sh) needs `ip` and `tc`.
#   bash benchmarks/device/iproute2.sh fetch     # here, with Debian's mirrors: the .debs into
#                                                # .device-carry/iproute2 (ignored by git)
#   source benchmarks/device/iproute2.sh use     # there: unpack into /tmp/iproute2, put it on
#                                                # PATH and LD_LIBRARY_PATH
# The device call must name .device-carry in `carry`.  Only the binaries and the libraries they
# link are unpacked (dpkg -x into /tmp, never into /); the kernel must still have network
# namespaces, veth and the tbf qdisc.
debs=.device-carry/iproute2
case ${1:-} in
  fetch)
    mkdir -p "$debs" && cd "$debs" && apt-get download iproute2 libbpf1 libelf1 libmnl0 \
      libcap2 libxtables12 libdb5.3 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 \
      libkrb5support0 libcom-err2 libkeyutils1 libbsd0 libmd0 zlib1g ;;
  use)
    if ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
      for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/iproute2; done
      export PATH=/tmp/iproute2/sbin:/tmp/iproute2/bin:$PATH
      export LD_LIBRARY_PATH=/tmp/iproute2/lib/x86_64-linux-gnu:/tmp/iproute2/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi ;;
  *) echo "usage: $0 fetch | source $0 use" >&2; false ;;
esac
