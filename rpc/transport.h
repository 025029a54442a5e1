/* transport.h — how the pserver's connections are secured: a small table of transports
 * (insecure, TLS), as the device backends are a table of backends.
 *
 *   insecure   plaintext gRPC (no files)
 *   tls        the pserver presents `cert` + `key`; trainers verify it against `ca`
 *   mutual tls the same, and the pserver requires a client certificate signed by `ca`,
 *              which trainers present (`client_cert` + `client_key`)
 *
 * The files are read and checked once, at start (rpc_transport_load): a file that is
 * missing or unreadable, not PEM, a certificate that is expired or not yet valid, a key
 * that does not match its certificate: one error naming the variable, the file and the
 * problem. The PEM texts are kept for the credentials gRPC makes per server / channel. */
#ifndef RPC_TRANSPORT_H
#define RPC_TRANSPORT_H

#include <grpc/grpc_security.h>

#include "common/error.h"

/* File paths ("" or NULL: not set), as the configuration gives them. */
typedef struct rpc_tls_files {
    const char *cert, *key;               /* pserver: its certificate (chain) and key */
    const char *ca;                       /* trainer: verifies the pserver; pserver: set =
                                           * require client certificates signed by it */
    const char *client_cert, *client_key; /* trainer: presented to the pserver (mutual) */
} rpc_tls_files;

typedef struct rpc_transport rpc_transport;

/* For the pserver (server = 1) or a trainer (0): insecure when no file is set; TLS
 * otherwise, with every file checked. Errors: PST_ERR_INVALID (one line: which variable,
 * which file, what is wrong), PST_ERR_NOMEM. */
pst_status rpc_transport_load(rpc_transport **out, const rpc_tls_files *files, int server);

/* "insecure", "tls" or "mutual tls". NULL: "insecure". */
const char *rpc_transport_name(const rpc_transport *t);

/* New credentials for a server / a channel (the caller releases them). NULL t: insecure. */
grpc_server_credentials *rpc_transport_server_creds(const rpc_transport *t);
grpc_channel_credentials *rpc_transport_channel_creds(const rpc_transport *t);

void rpc_transport_free(rpc_transport *t); /* accepts NULL */

#endif /* RPC_TRANSPORT_H */
