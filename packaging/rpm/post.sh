# plexus %post: enable plexusd.socket on first install (the service starts
# on the first CNI call) and plexus-plugins.socket (the plugin spawner);
# on upgrade restart a running plexusd.service and plexus-plugins.service,
# never the sockets. Enable and run plexus-shim-link.service, which links
# plexus-shim into /opt/cni/bin when that directory exists (it runs again
# at every boot).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
systemd-tmpfiles --create plexus.conf >/dev/null 2>&1 || :
if [ "$1" -eq 1 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl enable --now plexus-plugins.socket >/dev/null 2>&1 || :
        systemctl enable --now plexusd.socket >/dev/null 2>&1 || :
        systemctl enable --now plexus-shim-link.service >/dev/null 2>&1 || :
    else
        systemctl --no-reload enable plexus-plugins.socket >/dev/null 2>&1 || :
        systemctl --no-reload enable plexusd.socket >/dev/null 2>&1 || :
        systemctl --no-reload enable plexus-shim-link.service >/dev/null 2>&1 || :
    fi
elif [ -d /run/systemd/system ]; then
    systemctl try-restart plexus-plugins.service plexusd.service >/dev/null 2>&1 || :
    systemctl start plexus-shim-link.service >/dev/null 2>&1 || :
fi
