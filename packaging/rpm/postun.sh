# plexus %postun: on removal delete the link plexus-shim-link.service made
# in /opt/cni/bin (only while it still points to the packaged shim) and
# the attachment records in /var/lib/plexus.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 0 ]; then
    link=/opt/cni/bin/plexus-shim
    if [ -L "$link" ] && [ "$(readlink "$link")" = /usr/libexec/cni/plexus-shim ]; then
        rm -f "$link"
    fi
    rm -rf /var/lib/plexus
fi
