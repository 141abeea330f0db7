# plexus %postun: on removal delete the link plexus-shim-link.service made
# in /opt/cni/bin (only while it still points to the packaged shim) and
# the attachment records in /var/lib/plexus, warning first when
# containers still have records.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 0 ]; then
    link=/opt/cni/bin/plexus-shim
    if [ -L "$link" ] && [ "$(readlink "$link")" = /usr/libexec/cni/plexus-shim ]; then
        rm -f "$link"
    fi
    n=0
    ids=
    for f in /var/lib/plexus/attachments/*.json; do
        [ -f "$f" ] || continue
        n=$((n + 1))
        if [ "$n" -le 10 ]; then
            id=${f##*/}
            ids="$ids
plexus:   ${id%.json}"
        fi
    done
    if [ "$n" -gt 0 ]; then
        [ "$n" -le 10 ] || ids="$ids
plexus:   ..."
        cat >&2 <<MSG
plexus: warning: removing plexus deletes the attachment records of $n container(s) in
plexus: /var/lib/plexus/attachments:$ids
plexus: Without them plexusd cannot delete these containers' networks: a pod still running
plexus: with them leaves its interfaces and the addresses its IPAM plugins reserved behind.
plexus: Drain the node (kubectl drain NODE) or delete those pods before removing plexus;
plexus: \`crictl pods --id ID\` finds a pod that is still running.
MSG
    fi
    rm -rf /var/lib/plexus
fi
