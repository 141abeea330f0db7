# plexus %preun: on removal stop and disable the sockets, the service and
# the configuration watch.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now plexusd-multus.socket plexus-config.path plexus-config.service >/dev/null 2>&1 || :
    systemctl --no-reload disable --now plexusd.socket plexusd.service >/dev/null 2>&1 || :
fi
