# shellcheck shell=bash
# The secure mode of local-kafka (KAFKA_SECURITY=sasl_ssl), sourced by it:
# a CA and a broker certificate made for this data dir, SCRAM and PLAIN users
# with random passwords, a SASL_SSL client listener, a SASL_PLAINTEXT (PLAIN)
# controller listener on loopback, and the StandardAuthorizer with the ACLs of
# acls.py. Everything secret lives in $SECRETS (mode 700, files 600).

SECRETS="$DATA/secrets"
# admin is the super user (the broker itself, and `acls`); the others are the services' and the CLI's.
SECURE_USERS=(admin processor actuator agent notifier market cli)

secure_mode() { [[ "$KAFKA_SECURITY" == sasl_ssl ]]; }

# The mode a data dir was formatted in: SCRAM users exist only if it was
# formatted secure, so a data dir never switches modes.
check_mode_of_data_dir() {
    local formatted
    [[ -f "$LOGDIR/meta.properties" ]] || return 0
    formatted="$(cat "$DATA/security" 2>/dev/null || echo plaintext)"
    [[ "$formatted" == "$KAFKA_SECURITY" ]] ||
        die "$DATA was formatted with KAFKA_SECURITY=$formatted, not $KAFKA_SECURITY (use another KAFKA_DATA_DIR, or stop --wipe first)"
}

password_of() { cat "$SECRETS/$1.password"; }

# CA, broker key and certificate (SAN 127.0.0.1, localhost and $SECURE_EXTRA_SAN), one password per user.
# Made once per data dir: the SCRAM credentials formatted into it must keep matching.
make_secrets() {
    [[ -f "$SECRETS/.complete" ]] && return 0
    command -v openssl >/dev/null || die "openssl not found: KAFKA_SECURITY=sasl_ssl makes its certificates with it"
    rm -rf "$SECRETS"
    mkdir -p "$SECRETS"
    chmod 700 "$SECRETS"
    (
        umask 077
        cd "$SECRETS"
        local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
        openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 30 -subj "/CN=local-kafka CA $KAFKA_PORT" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
        openssl req "${ec[@]}" -keyout broker.key -out broker.csr -subj "/CN=localhost" 2>/dev/null
        # SECURE_EXTRA_SAN: more names, e.g. ",DNS:kafka" for compose-secrets.
        printf 'subjectAltName=IP:%s,DNS:localhost%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' \
            "$HOST" "${SECURE_EXTRA_SAN:-}" >broker.ext
        openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out broker.crt -days 30 \
            -extfile broker.ext 2>/dev/null
        # Kafka's PEM keystore: the (PKCS#8, unencrypted) key, then the chain.
        cat broker.key broker.crt ca.pem >broker.pem
        rm -f broker.csr broker.ext ca.srl
        local user
        for user in "${SECURE_USERS[@]}"; do
            # Letters and digits only: the password goes into JAAS strings and --add-scram unquoted.
            head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32 >"$user.password"
        done
    ) || die "making the certificates in $SECRETS failed"
    chmod 644 "$SECRETS/ca.pem"
    touch "$SECRETS/.complete"
}

# The listener settings of the secure mode, appended to the effective config.
secure_props() {
    local admin user plain_users=""
    admin="$(password_of admin)"
    for user in "${SECURE_USERS[@]}"; do plain_users+=" user_$user=\"$(password_of "$user")\""; done
    cat <<EOF
listeners=SASL_SSL://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=SASL_SSL://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
# KRaft cannot use SCRAM towards the controller (its credentials live in the
# metadata the controller serves): PLAIN on loopback, the admin only.
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin" user_admin="$admin";
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin";
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin"$plain_users;
ssl.keystore.type=PEM
ssl.keystore.location=$SECRETS/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$SECRETS/ca.pem
# A client certificate is checked when one is given (it must be signed by
# ca.pem); SASL names the user either way. (On a SASL_SSL listener only the
# listener's own setting counts.)
listener.name.sasl_ssl.ssl.client.auth=requested
ssl.endpoint.identification.algorithm=https
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false
EOF
}

# --add-scram arguments for kafka-storage format: every user, both SCRAM hashes.
scram_args() {
    local user mech
    SCRAM_ARGS=()
    for user in "${SECURE_USERS[@]}"; do
        for mech in SCRAM-SHA-512 SCRAM-SHA-256; do
            SCRAM_ARGS+=(--add-scram "$mech=[name=$user,password=$(password_of "$user")]")
        done
    done
}

# The client settings of the admin, for the readiness probe and acls.py.
export_admin_client() {
    export LOCAL_KAFKA_SECRETS="$SECRETS"
}

# What a client needs, as shell: the CLI user's credentials; the services'
# users have their password files next to it.
print_client_env() {
    cat <<EOF
export TRAINWARDEN_KAFKA=$BOOTSTRAP
export TRAINWARDEN_KAFKA_SECURITY_PROTOCOL=SASL_SSL
export TRAINWARDEN_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
export TRAINWARDEN_KAFKA_SSL_CAFILE=$SECRETS/ca.pem
export TRAINWARDEN_KAFKA_SASL_USERNAME=cli
export TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE=$SECRETS/cli.password
# users ${SECURE_USERS[*]}: password files $SECRETS/USER.password; ACLs for topic prefix(es) $KAFKA_TOPIC_PREFIXES
EOF
}
