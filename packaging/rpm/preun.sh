# plexus %preun: on removal stop and disable the socket and the service.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now plexusd.socket plexusd.service >/dev/null 2>&1 || :
fi
