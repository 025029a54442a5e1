/* transport.c — the transports of transport.h: insecure and TLS over gRPC C core's SSL
 * credentials, with the certificate checks done at start through OpenSSL (which gRPC
 * itself uses on Debian), so that a bad file is one clear line instead of a handshake
 * that fails on every connection. */
#include "rpc/transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/memory.h"

struct rpc_transport {
    const struct transport_kind *kind;
    int server;
    char *cert, *key, *ca; /* PEM texts (NULL: not set) */
};

/* ---- the table ------------------------------------------------------------------------ */

typedef struct transport_kind {
    const char *name;
    grpc_server_credentials *(*server_creds)(const rpc_transport *t);
    grpc_channel_credentials *(*channel_creds)(const rpc_transport *t);
} transport_kind;

static grpc_server_credentials *insecure_server(const rpc_transport *t)
{
    (void)t;
    return grpc_insecure_server_credentials_create();
}

static grpc_channel_credentials *insecure_channel(const rpc_transport *t)
{
    (void)t;
    return grpc_insecure_credentials_create();
}

static grpc_server_credentials *tls_server(const rpc_transport *t)
{
    grpc_ssl_pem_key_cert_pair pair = {.private_key = t->key, .cert_chain = t->cert};
    return grpc_ssl_server_credentials_create_ex(
        t->ca, &pair, 1,
        t->ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
              : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
}

static grpc_channel_credentials *tls_channel(const rpc_transport *t)
{
    grpc_ssl_pem_key_cert_pair pair = {.private_key = t->key, .cert_chain = t->cert};
    return grpc_ssl_credentials_create_ex(t->ca, t->cert ? &pair : NULL, NULL, NULL);
}

static const transport_kind kinds[] = {
    {"insecure", insecure_server, insecure_channel},
    {"tls", tls_server, tls_channel},
};

/* ---- checks --------------------------------------------------------------------------- */

/* The whole file as a NUL-terminated string, or NULL with the error set. */
static char *read_pem(const char *var, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        pst_error_set(PST_ERR_INVALID, "%s=%s: cannot read it: %s", var, path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *more = cap <= (1u << 24) ? realloc(text, cap) : NULL;
            if (!more) {
                free(text);
                fclose(f);
                pst_error_set(PST_ERR_INVALID, "%s=%s: larger than 16 MiB: not a PEM file",
                              var, path);
                return NULL;
            }
            text = more;
        }
        size_t n = fread(text + len, 1, 4096, f);
        len += n;
        if (n < 4096)
            break;
    }
    const int err = ferror(f);
    fclose(f);
    if (err) {
        free(text);
        pst_error_set(PST_ERR_INVALID, "%s=%s: cannot read it", var, path);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* OpenSSL's reason for the last failure, for the message. */
static const char *ssl_reason(void)
{
    static _Thread_local char buf[160];
    unsigned long e = ERR_peek_last_error();
    ERR_clear_error();
    if (!e)
        return "no PEM block of that kind";
    ERR_error_string_n(e, buf, sizeof buf);
    return buf;
}

static void asn1_date(const ASN1_TIME *t, char *out, size_t n)
{
    struct tm tm;
    if (ASN1_TIME_to_tm(t, &tm) == 1)
        strftime(out, n, "%Y-%m-%d %H:%M:%S UTC", &tm);
    else
        snprintf(out, n, "(unreadable date)");
}

/* The first certificate of `pem`: PEM, and valid now. Returns it (the caller frees) or
 * NULL with the error set. */
static X509 *check_cert(const char *var, const char *path, const char *pem)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    X509 *x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (!x) {
        pst_error_set(PST_ERR_INVALID, "%s=%s: not a PEM certificate (%s)", var, path,
                      ssl_reason());
        return NULL;
    }
    char date[64];
    if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0) {
        asn1_date(X509_get0_notAfter(x), date, sizeof date);
        pst_error_set(PST_ERR_INVALID, "%s=%s: the certificate expired on %s", var, path, date);
        X509_free(x);
        return NULL;
    }
    if (X509_cmp_current_time(X509_get0_notBefore(x)) >= 0) {
        asn1_date(X509_get0_notBefore(x), date, sizeof date);
        pst_error_set(PST_ERR_INVALID, "%s=%s: the certificate is not valid before %s", var,
                      path, date);
        X509_free(x);
        return NULL;
    }
    return x;
}

/* cert + key: both readable, the certificate valid now, the key PEM and the certificate's. */
static pst_status check_pair(const char *cvar, const char *cpath, const char *cpem,
                             const char *kvar, const char *kpath, const char *kpem)
{
    X509 *x = check_cert(cvar, cpath, cpem);
    if (!x)
        return PST_ERR_INVALID;
    BIO *bio = BIO_new_mem_buf(kpem, -1);
    EVP_PKEY *k = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    pst_status st = PST_OK;
    if (!k)
        st = pst_error_set(PST_ERR_INVALID, "%s=%s: not a PEM private key (%s)", kvar, kpath,
                           ssl_reason());
    else if (X509_check_private_key(x, k) != 1)
        st = pst_error_set(PST_ERR_INVALID, "%s=%s: the key does not match the certificate "
                           "%s=%s", kvar, kpath, cvar, cpath);
    ERR_clear_error();
    EVP_PKEY_free(k);
    X509_free(x);
    return st;
}

/* ---- the interface -------------------------------------------------------------------- */

static int set(const char *s)
{
    return s && s[0];
}

pst_status rpc_transport_load(rpc_transport **out, const rpc_tls_files *f, int server)
{
    *out = NULL;
    const char *cv = server ? "PSTRAIN_TLS_CERT" : "PSTRAIN_TLS_CLIENT_CERT";
    const char *kv = server ? "PSTRAIN_TLS_KEY" : "PSTRAIN_TLS_CLIENT_KEY";
    const char *cp = server ? f->cert : f->client_cert, *kp = server ? f->key : f->client_key;
    const int tls = set(cp) || set(kp) || set(f->ca);
    rpc_transport *t = calloc(1, sizeof *t);
    if (!t)
        return pst_error_set(PST_ERR_NOMEM, "transport: out of memory");
    t->server = server;
    t->kind = &kinds[tls ? 1 : 0];
    if (!tls) {
        *out = t;
        return PST_OK;
    }
    pst_status st = PST_OK;
    if (set(cp) != set(kp))
        st = pst_error_set(PST_ERR_INVALID, "%s is set but not %s: give both (example: %s=/tls/"
                           "tls.crt %s=/tls/tls.key)", set(cp) ? cv : kv, set(cp) ? kv : cv, cv,
                           kv);
    else if (server && !set(cp))
        st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TLS_CA without PSTRAIN_TLS_CERT and "
                           "PSTRAIN_TLS_KEY: a TLS pserver needs its certificate and key "
                           "(example: PSTRAIN_TLS_CERT=/tls/tls.crt PSTRAIN_TLS_KEY=/tls/tls.key)");
    else if (!server && !set(f->ca))
        st = pst_error_set(PST_ERR_INVALID, "%s without PSTRAIN_TLS_CA: a trainer verifies the "
                           "pservers with the CA that signed them (example: PSTRAIN_TLS_CA=/tls/"
                           "ca.crt)", cv);
    if (st == PST_OK && set(cp) && (!(t->cert = read_pem(cv, cp)) || !(t->key = read_pem(kv, kp))))
        st = PST_ERR_INVALID;
    if (st == PST_OK && set(cp))
        st = check_pair(cv, cp, t->cert, kv, kp, t->key);
    if (st == PST_OK && set(f->ca)) {
        X509 *x = (t->ca = read_pem("PSTRAIN_TLS_CA", f->ca)) ? check_cert("PSTRAIN_TLS_CA",
                                                                           f->ca, t->ca)
                                                              : NULL;
        if (!x)
            st = PST_ERR_INVALID;
        X509_free(x);
    }
    if (st != PST_OK) {
        rpc_transport_free(t);
        return st;
    }
    *out = t;
    return PST_OK;
}

const char *rpc_transport_name(const rpc_transport *t)
{
    if (!t || t->kind == &kinds[0])
        return "insecure";
    return t->server ? (t->ca ? "mutual tls" : "tls") : (t->cert ? "mutual tls" : "tls");
}

grpc_server_credentials *rpc_transport_server_creds(const rpc_transport *t)
{
    return t ? t->kind->server_creds(t) : insecure_server(NULL);
}

grpc_channel_credentials *rpc_transport_channel_creds(const rpc_transport *t)
{
    return t ? t->kind->channel_creds(t) : insecure_channel(NULL);
}

void rpc_transport_free(rpc_transport *t)
{
    if (!t)
        return;
    if (t->key) /* a private key: not left in freed memory */
        memset(t->key, 0, strlen(t->key));
    PST_FREE_ALL(t->cert, t->key, t->ca, t);
}
