# plexus %preun: on removal stop and disable the sockets, the service, the
# configuration watch and the shim link unit.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now plexusd-multus.socket plexus-config.path plexus-config.service >/dev/null 2>&1 || :
    systemctl --no-reload disable --now plexusd.socket plexusd.service >/dev/null 2>&1 || :
    systemctl --no-reload disable --now plexus-plugins.socket plexus-plugins.service >/dev/null 2>&1 || :
    systemctl --no-reload disable plexus-shim-link.service >/dev/null 2>&1 || :
fi
