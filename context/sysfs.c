/*
 * context/sysfs.c - what sysfs says about a GID entry's network device.
 *
 * Every sysfs read of the context layer goes through here, under the set's sysfs root
 * ("/sys" unless the configuration names another: tests point it at a fixture tree,
 * containers at a bind-mounted host /sys). Reads are bounded and never block: a file is
 * opened non-blocking, must be a regular file, and is read once into a small buffer; a
 * missing, unreadable, oversized or malformed file is "no information", never a crash.
 *
 * The netdev of entry I of port P of device D is the name in
 * <root>/class/infiniband/D/ports/P/gid_attrs/ndevs/I (the kernel fills it on RoCE ports;
 * InfiniBand ports have no netdevs). Its state is <root>/class/net/<name>/operstate:
 * "up" is up, and so is "unknown": the kernel reports unknown for drivers that do not
 * track an operational state (dummy, tun and several virtual NICs that RoCE and soft-RoCE
 * run over carry traffic in that state), so treating it as down would pass such a
 * working interface over for one with no netdev at all. Every other state (down,
 * lowerlayerdown, dormant, notpresent, testing) is down.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "context/context_internal.h"

/* A sysfs value is short; longer content is not what we expect and is refused. */
#define SYSFS_VALUE_MAX 64

const char *ote__context_sysfs_root(const ote_context_set_t *set) {
    return set->sysfs_root != NULL ? set->sysfs_root : "/sys";
}

/* The first line of root/rel, without trailing whitespace, into buf (cap bytes, NUL
 * terminated). 0, or an errno: ENOENT and the like from open, EINVAL for anything but a
 * regular file, EOVERFLOW for content that does not fit. */
static int read_value(const char *root, const char *rel, char *buf, size_t cap) {
    char path[512];
    int n = snprintf(path, sizeof(path), "%s/%s", root, rel);
    if (n < 0 || (size_t)n >= sizeof(path)) return ENAMETOOLONG;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return errno;
    struct stat sb;
    int err = 0;
    ssize_t got = 0;
    if (fstat(fd, &sb) != 0) err = errno;
    else if (!S_ISREG(sb.st_mode)) err = EINVAL; /* a FIFO or device would not end */
    else {
        do got = read(fd, buf, cap);
        while (got < 0 && errno == EINTR);
        if (got < 0) err = errno;
        else if ((size_t)got >= cap) err = EOVERFLOW;
    }
    close(fd);
    if (err != 0) return err;
    size_t len = (size_t)got;
    char *nl = memchr(buf, '\n', len);
    if (nl != NULL) len = (size_t)(nl - buf);
    while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t' || buf[len - 1] == '\r')) len--;
    buf[len] = '\0';
    return 0;
}

/* A name the kernel could have given a netdev: 1..15 visible characters, no '/', not "."
 * or "..", so that it stays one path component under class/net. */
static int netdev_name_ok(const char *s) {
    size_t len = strlen(s);
    if (len == 0 || len > 15 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == '/') return 0;
    }
    return 1;
}

ote_context_netdev_t ote__context_gid_netdev(const ote_context_t *ctx, uint8_t port, uint32_t index,
                                             char name_out[16]) {
    const char *root = ote__context_sysfs_root(ctx->set);
    char rel[256], value[SYSFS_VALUE_MAX];
    name_out[0] = '\0';
    int n = snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%u/gid_attrs/ndevs/%u", ctx->name,
                     (unsigned)port, (unsigned)index);
    if (n < 0 || (size_t)n >= sizeof(rel)) return OTE_CONTEXT_NETDEV_NONE;
    int err = read_value(root, rel, value, sizeof(value));
    if (err != 0 || !netdev_name_ok(value)) {
        if (err != 0 && err != ENOENT)
            OTE_DEBUG("context", "%s/%s: %s (no netdev)", root, rel,
                      err == EOVERFLOW ? "too long" : strerror(err));
        else if (err == 0 && value[0] != '\0')
            OTE_DEBUG("context", "%s/%s: not a netdev name (no netdev)", root, rel);
        return OTE_CONTEXT_NETDEV_NONE;
    }
    memcpy(name_out, value, strlen(value) + 1);
    n = snprintf(rel, sizeof(rel), "class/net/%s/operstate", name_out);
    if (n < 0 || (size_t)n >= sizeof(rel)) return OTE_CONTEXT_NETDEV_DOWN;
    err = read_value(root, rel, value, sizeof(value));
    if (err != 0) {
        OTE_DEBUG("context", "%s/%s: %s (netdev %s counted down)", root, rel,
                  err == EOVERFLOW ? "too long" : strerror(err), name_out);
        return OTE_CONTEXT_NETDEV_DOWN;
    }
    return strcmp(value, "up") == 0 || strcmp(value, "unknown") == 0 ? OTE_CONTEXT_NETDEV_UP
                                                                     : OTE_CONTEXT_NETDEV_DOWN;
}
