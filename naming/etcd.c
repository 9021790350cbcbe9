/*
 * naming/etcd.c - the etcd store: etcd v3's JSON gateway (/v3/kv/put, /v3/kv/range,
 * /v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke) over
 * libcurl, answers parsed by cJSON; keys and values are base64 on the wire.
 *
 * One curl handle, under the store's mutex, so its connection is reused (a resolve is
 * one request on an open connection). A call has timeout_ms per endpoint in all, the wait
 * for the mutex included (a watch's request of another thread may hold it while the store
 * does not answer): each request's CURLOPT_TIMEOUT_MS is timeout_ms or what is left of the
 * call's time, less; the endpoints are tried in order from the last one that answered.
 */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "naming/naming_internal.h"

#define ETCD_ENDPOINTS_MAX 16
#define ETCD_BODY_MAX (16u << 20)

typedef struct {
    ote_mutex_t mu;
    CURL *curl;
    uint32_t timeout_ms;
    size_t n;
    size_t cur; /* the endpoint that answered last */
    char *ep[ETCD_ENDPOINTS_MAX];
} etcd_t;

typedef struct {
    char *p;
    size_t n;
    int over;
} body_t;

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_enc(const uint8_t *in, size_t n) {
    char *o = ote_malloc((n + 2) / 3 * 4 + 1);
    if (o == NULL) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        o[j++] = B64[(v >> 18) & 63];
        o[j++] = B64[(v >> 12) & 63];
        o[j++] = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        o[j++] = i + 2 < n ? B64[v & 63] : '=';
    }
    o[j] = '\0';
    return o;
}

static int b64_val(char c) {
    const char *p = c != '\0' ? strchr(B64, c) : NULL;
    return p != NULL ? (int)(p - B64) : -1;
}

/* Strict decoding (length a multiple of 4, '=' only at the end): OTE_ERR_PROTOCOL else. */
static ote_status_t b64_dec(const char *s, uint8_t **out, size_t *len_out) {
    size_t n = strlen(s);
    if (n % 4 != 0) return OTE_ERR_PROTOCOL;
    uint8_t *o = ote_malloc(n / 4 * 3 + 1);
    if (o == NULL) return OTE_ERR_NOMEM;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        int a = b64_val(s[i]), b = b64_val(s[i + 1]);
        int c = pad >= 2 ? 0 : b64_val(s[i + 2]), d = pad >= 1 ? 0 : b64_val(s[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0 || (pad > 0 && i + 4 != n)) {
            ote_free(o);
            return OTE_ERR_PROTOCOL;
        }
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        o[j++] = (uint8_t)(v >> 16);
        if (pad < 2) o[j++] = (uint8_t)(v >> 8);
        if (pad < 1) o[j++] = (uint8_t)v;
    }
    *out = o;
    *len_out = j;
    return OTE_OK;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg) {
    body_t *b = arg;
    size_t n = size * nmemb;
    if (b->over || b->n + n > ETCD_BODY_MAX) {
        b->over = 1;
        return 0;
    }
    char *p = ote_realloc(b->p, b->n + n + 1);
    if (p == NULL) return 0;
    memcpy(p + b->n, data, n);
    b->p = p;
    b->n += n;
    p[b->n] = '\0';
    return n;
}

static ote_status_t curl_status(CURLcode rc) {
    switch (rc) {
        case CURLE_OPERATION_TIMEDOUT: return OTE_ERR_TIMEOUT;
        case CURLE_OUT_OF_MEMORY: return OTE_ERR_NOMEM;
        default: return OTE_ERR_CONNECT;
    }
}

/* POST body to one endpoint; the parsed answer in *json_out (HTTP 200 only). */
static ote_status_t post_one(etcd_t *s, size_t i, const char *path, const char *body,
                             long timeout_ms, cJSON **json_out) {
    char url[512];
    if (snprintf(url, sizeof(url), "http://%s%s", s->ep[i], path) >= (int)sizeof(url))
        return OTE_ERR_INVALID;
    body_t b = {0};
    curl_easy_reset(s->curl);
    curl_easy_setopt(s->curl, CURLOPT_URL, url);
    curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(s->curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(s->curl);
    long code = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &code);
    ote_status_t st = OTE_OK;
    if (rc != CURLE_OK) {
        OTE_WARN("naming", "etcd %s: %s", url, curl_easy_strerror(rc));
        st = b.over ? OTE_ERR_PROTOCOL : curl_status(rc);
    } else if (code != 200 || b.p == NULL) {
        OTE_WARN("naming", "etcd %s: HTTP %ld: %.200s", url, code, b.p ? b.p : "");
        st = OTE_ERR_REMOTE;
    } else if ((*json_out = cJSON_Parse(b.p)) == NULL) {
        OTE_WARN("naming", "etcd %s: an answer that is not JSON", url);
        st = OTE_ERR_PROTOCOL;
    }
    ote_free(b.p);
    return st;
}

/* POST to the endpoints in turn, from the last that answered; transport failures move on
 * to the next one, an answer (even an error) ends the call. */
static ote_status_t post(etcd_t *s, const char *path, const char *body, cJSON **json_out) {
    ote_deadline_t dl = ote_deadline_after((uint64_t)s->timeout_ms * s->n * OTE_NSEC_PER_MSEC);
    if (ote_mutex_lock_until(&s->mu, dl) != OTE_OK) {
        OTE_WARN("naming", "etcd %s: no answer in %llu ms (the store's other requests)", path,
                 (unsigned long long)s->timeout_ms * s->n);
        return OTE_ERR_TIMEOUT;
    }
    ote_status_t st = OTE_ERR_CONNECT;
    for (size_t k = 0; k < s->n; k++) {
        size_t i = (s->cur + k) % s->n;
        int left = ote_deadline_remaining_ms(dl, (int)s->timeout_ms);
        if (left <= 0) {
            st = OTE_ERR_TIMEOUT;
            break;
        }
        st = post_one(s, i, path, body, left, json_out);
        if (st == OTE_OK || st == OTE_ERR_REMOTE || st == OTE_ERR_PROTOCOL || st == OTE_ERR_NOMEM) {
            s->cur = i;
            break;
        }
    }
    ote_mutex_unlock(&s->mu);
    return st;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A JSON body {"k1": "v1", ...} from n pairs; values starting with '#' are raw. */
static char *jbody(int n, const char *const *kv) {
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        const char *v = kv[2 * i + 1];
        cJSON *item = v[0] == '#' ? cJSON_CreateRaw(v + 1) : cJSON_CreateString(v);
        if (item == NULL || !cJSON_AddItemToObject(o, kv[2 * i], item)) {
            cJSON_Delete(item);
            cJSON_Delete(o);
            return NULL;
        }
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static ote_status_t call(etcd_t *s, const char *path, int n, const char *const *kv,
                         cJSON **json_out) {
    char *body = jbody(n, kv);
    if (body == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = post(s, path, body, json_out);
    cJSON_free(body);
    return st;
}

static ote_status_t grant(etcd_t *s, uint32_t ttl_ms, uint64_t *lease) {
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "#%u", (ttl_ms + 999) / 1000);
    const char *kv[] = {"TTL", ttl};
    cJSON *j = NULL;
    ote_status_t st = call(s, "/v3/lease/grant", 1, kv, &j);
    if (st != OTE_OK) return st;
    const char *id = jstr(j, "ID");
    uint64_t v = id != NULL ? strtoull(id, NULL, 10) : 0;
    cJSON_Delete(j);
    if (v == 0) return OTE_ERR_PROTOCOL;
    *lease = v;
    return OTE_OK;
}

static ote_status_t etcd_put(void *st_, const char *key, const uint8_t *val, size_t len,
                             uint32_t ttl_ms, uint64_t *lease) {
    etcd_t *s = st_;
    ote_status_t st = *lease == 0 ? grant(s, ttl_ms, lease) : OTE_OK;
    if (st != OTE_OK) return st;
    char *k = b64_enc((const uint8_t *)key, strlen(key)), *v = b64_enc(val, len);
    char id[32];
    snprintf(id, sizeof(id), "%" PRIu64, *lease);
    cJSON *j = NULL;
    st = k != NULL && v != NULL ? OTE_OK : OTE_ERR_NOMEM;
    if (st == OTE_OK) {
        const char *kv[] = {"key", k, "value", v, "lease", id};
        st = call(s, "/v3/kv/put", 3, kv, &j);
    }
    cJSON_Delete(j);
    ote_free(k);
    ote_free(v);
    return st;
}

static ote_status_t etcd_refresh(void *st_, const char *key, const uint8_t *val, size_t len,
                                 uint32_t ttl_ms, uint64_t *lease) {
    etcd_t *s = st_;
    char id[32];
    snprintf(id, sizeof(id), "%" PRIu64, *lease);
    const char *kv[] = {"ID", id};
    cJSON *j = NULL;
    ote_status_t st = call(s, "/v3/lease/keepalive", 1, kv, &j);
    if (st != OTE_OK) return st;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "result");
    const char *ttl = r != NULL ? jstr(r, "TTL") : NULL;
    int alive = ttl != NULL && strtoll(ttl, NULL, 10) > 0;
    cJSON_Delete(j);
    if (alive) return OTE_OK;
    /* The lease ended (the store was away longer than the TTL): write the name again. */
    OTE_WARN("naming", "etcd: the lease of %s ended; publishing it again", key);
    *lease = 0;
    return etcd_put(s, key, val, len, ttl_ms, lease);
}

static ote_status_t etcd_get(void *st_, const char *key, uint8_t **val_out, size_t *len_out) {
    etcd_t *s = st_;
    char *k = b64_enc((const uint8_t *)key, strlen(key));
    if (k == NULL) return OTE_ERR_NOMEM;
    const char *kv[] = {"key", k};
    cJSON *j = NULL;
    ote_status_t st = call(s, "/v3/kv/range", 1, kv, &j);
    ote_free(k);
    if (st != OTE_OK) return st;
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(j, "kvs");
    const cJSON *first = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
    const char *v = first != NULL ? jstr(first, "value") : NULL;
    if (first == NULL) st = OTE_ERR_NOT_FOUND;
    else if (v == NULL) st = OTE_ERR_PROTOCOL;
    else st = b64_dec(v, val_out, len_out);
    cJSON_Delete(j);
    return st;
}

static ote_status_t keys_of(const cJSON *kvs, char ***keys_out, size_t *n_out) {
    size_t n = cJSON_IsArray(kvs) ? (size_t)cJSON_GetArraySize(kvs) : 0;
    char **keys = ote_calloc(n + 1, sizeof(char *));
    if (keys == NULL) return OTE_ERR_NOMEM;
    size_t i = 0;
    ote_status_t st = OTE_OK;
    for (const cJSON *e = kvs != NULL ? kvs->child : NULL; e != NULL && i < n; e = e->next) {
        const char *k = jstr(e, "key");
        uint8_t *raw = NULL;
        size_t len = 0;
        st = k != NULL ? b64_dec(k, &raw, &len) : OTE_ERR_PROTOCOL;
        if (st != OTE_OK) break;
        raw[len] = '\0'; /* b64_dec leaves a byte spare */
        keys[i++] = (char *)raw;
    }
    if (st != OTE_OK) {
        for (size_t x = 0; x < i; x++) ote_free(keys[x]);
        ote_free(keys);
        return st;
    }
    *keys_out = keys;
    *n_out = i;
    return OTE_OK;
}

static ote_status_t etcd_list(void *st_, const char *prefix, char ***keys_out, size_t *n_out) {
    etcd_t *s = st_;
    size_t pl = strlen(prefix);
    if (pl == 0 || (uint8_t)prefix[pl - 1] == 0xff) return OTE_ERR_INVALID;
    char *end = ote_strdup(prefix);
    if (end == NULL) return OTE_ERR_NOMEM;
    end[pl - 1]++;
    char *k = b64_enc((const uint8_t *)prefix, pl), *e = b64_enc((const uint8_t *)end, pl);
    ote_free(end);
    cJSON *j = NULL;
    ote_status_t st = k != NULL && e != NULL ? OTE_OK : OTE_ERR_NOMEM;
    if (st == OTE_OK) {
        const char *kv[] = {"key", k, "range_end", e, "keys_only", "#true"};
        st = call(s, "/v3/kv/range", 3, kv, &j);
    }
    ote_free(k);
    ote_free(e);
    if (st == OTE_OK) st = keys_of(cJSON_GetObjectItemCaseSensitive(j, "kvs"), keys_out, n_out);
    cJSON_Delete(j);
    return st;
}

static ote_status_t etcd_del(void *st_, const char *key, uint64_t lease) {
    etcd_t *s = st_;
    cJSON *j = NULL;
    ote_status_t st;
    if (lease != 0) { /* revoking the lease deletes the key with it */
        char id[32];
        snprintf(id, sizeof(id), "%" PRIu64, lease);
        const char *kv[] = {"ID", id};
        st = call(s, "/v3/lease/revoke", 1, kv, &j);
    } else {
        char *k = b64_enc((const uint8_t *)key, strlen(key));
        if (k == NULL) return OTE_ERR_NOMEM;
        const char *kv[] = {"key", k};
        st = call(s, "/v3/kv/deleterange", 1, kv, &j);
        ote_free(k);
    }
    cJSON_Delete(j);
    return st;
}

static void etcd_close(void *st_) {
    etcd_t *s = st_;
    if (s == NULL) return;
    for (size_t i = 0; i < s->n; i++) ote_free(s->ep[i]);
    if (s->curl != NULL) curl_easy_cleanup(s->curl);
    ote_mutex_destroy(&s->mu);
    ote_free(s);
}

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init;
static void curl_init(void) { g_curl_init = curl_global_init(CURL_GLOBAL_DEFAULT); }

static ote_status_t split_hosts(etcd_t *s, const char *hosts) {
    const char *p = hosts;
    while (*p != '\0') {
        const char *c = strchr(p, ',');
        size_t n = c != NULL ? (size_t)(c - p) : strlen(p);
        if (n == 0 || n > 255 || s->n == ETCD_ENDPOINTS_MAX || memchr(p, '/', n) != NULL)
            return OTE_ERR_INVALID;
        if ((s->ep[s->n] = ote_calloc(1, n + 1)) == NULL) return OTE_ERR_NOMEM;
        memcpy(s->ep[s->n++], p, n);
        p += n + (c != NULL);
        if (c != NULL && *p == '\0') return OTE_ERR_INVALID;
    }
    return s->n > 0 ? OTE_OK : OTE_ERR_INVALID;
}

ote_status_t ote__etcd_open(const char *hosts, uint32_t timeout_ms, void **st_out) {
    pthread_once(&g_curl_once, curl_init);
    if (g_curl_init != CURLE_OK) return OTE_ERR_NATIVE;
    etcd_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&s->mu);
    if (st != OTE_OK) {
        ote_free(s);
        return st;
    }
    s->timeout_ms = timeout_ms;
    st = split_hosts(s, hosts);
    if (st == OTE_OK && (s->curl = curl_easy_init()) == NULL) st = OTE_ERR_NOMEM;
    if (st == OTE_OK) { /* one round trip: something answers as etcd */
        uint8_t *v = NULL;
        size_t n = 0;
        st = etcd_get(s, "orbitte-naming-probe", &v, &n);
        ote_free(v);
        if (st == OTE_ERR_NOT_FOUND) st = OTE_OK;
    }
    if (st != OTE_OK) {
        OTE_WARN("naming", "etcd://%s: %s", hosts, ote_status_str(st));
        etcd_close(s);
        return st;
    }
    *st_out = s;
    return OTE_OK;
}

const ote__nstore_ops_t ote__etcd_ops = {
    .put = etcd_put,
    .refresh = etcd_refresh,
    .get = etcd_get,
    .list = etcd_list,
    .del = etcd_del,
    .close = etcd_close,
};
