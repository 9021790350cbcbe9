/*
 * engine/rdma/selector/topo_file.c - the rdma_topology file's reader (topo_file.h).
 */
#include "engine/rdma/selector/topo_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

#define TOPO_LINE_MAX 4096

/* The head "gpu<N>" / "numa<N>": 0 on success. */
static int parse_head(const char *w, ote_topo_kind_t *kind, int *index) {
    const char *num = NULL;
    if (strncmp(w, "gpu", 3) == 0) {
        *kind = OTE_TOPO_GPU;
        num = w + 3;
    } else if (strncmp(w, "numa", 4) == 0) {
        *kind = OTE_TOPO_NUMA;
        num = w + 4;
    } else {
        return -1;
    }
    if (*num < '0' || *num > '9' || strlen(num) > 3) return -1;
    char *end = NULL;
    long v = strtol(num, &end, 10);
    if (*end != '\0' || v > OTE_TOPO_FILE_MAX_INDEX) return -1;
    *index = (int)v;
    return 0;
}

/* One line's words into e (a head already parsed). 0, or -1 with err written. */
static int parse_nics(char *rest, ote_topo_entry_t *e, char *err, size_t errcap) {
    char *save = NULL;
    for (char *w = strtok_r(rest, " \t", &save); w != NULL; w = strtok_r(NULL, " \t", &save)) {
        if (strlen(w) >= OTE_SELECTOR_NAME_MAX) {
            snprintf(err, errcap, "line %d: device name \"%.32s...\" is too long", e->line, w);
            return -1;
        }
        for (size_t i = 0; i < e->n; i++) {
            if (strcmp(e->nics[i], w) == 0) {
                snprintf(err, errcap, "line %d: device %s is listed twice", e->line, w);
                return -1;
            }
        }
        if (e->n == OTE_SELECTOR_MAX_DEVICES) {
            snprintf(err, errcap, "line %d: more than %d devices", e->line,
                     OTE_SELECTOR_MAX_DEVICES);
            return -1;
        }
        snprintf(e->nics[e->n++], OTE_SELECTOR_NAME_MAX, "%s", w);
    }
    if (e->n == 0) {
        snprintf(err, errcap, "line %d: no device listed", e->line);
        return -1;
    }
    return 0;
}

/* One line (comment and newline cut): skipped, or an entry appended. 0, or -1. */
static int parse_line(ote_topo_file_t *f, char *text, int line, char *err, size_t errcap) {
    char *save = NULL;
    char *head = strtok_r(text, " \t\r", &save);
    if (head == NULL) return 0; /* blank */
    ote_topo_entry_t e = {.line = line};
    if (parse_head(head, &e.kind, &e.index) != 0) {
        snprintf(err, errcap, "line %d: \"%.32s\" is not gpu<N> or numa<N> (N from 0 to %d)", line,
                 head, OTE_TOPO_FILE_MAX_INDEX);
        return -1;
    }
    const ote_topo_entry_t *dup = ote_topo_file_find(f, e.kind, e.index);
    if (dup != NULL) {
        snprintf(err, errcap, "line %d: %s is already given on line %d", line, head, dup->line);
        return -1;
    }
    char *rest = save != NULL ? save : head + strlen(head);
    for (char *c = rest; *c != '\0'; c++)
        if (*c == '\r') *c = ' ';
    if (parse_nics(rest, &e, err, errcap) != 0) return -1;
    if (f->n == OTE_TOPO_FILE_MAX_ENTRIES) {
        snprintf(err, errcap, "line %d: more than %d entries", line, OTE_TOPO_FILE_MAX_ENTRIES);
        return -1;
    }
    f->e[f->n++] = e;
    return 0;
}

static ote_status_t read_lines(FILE *fp, ote_topo_file_t *f, char *err, size_t errcap) {
    char buf[TOPO_LINE_MAX];
    int line = 0;
    while (fgets(buf, sizeof(buf), fp) != NULL) {
        line++;
        size_t len = strlen(buf);
        if (len == sizeof(buf) - 1 && buf[len - 1] != '\n' && !feof(fp)) {
            snprintf(err, errcap, "line %d: longer than %d bytes", line, TOPO_LINE_MAX - 2);
            return OTE_ERR_INVALID;
        }
        char *hash = strchr(buf, '#');
        if (hash != NULL) *hash = '\0';
        char *nl = strchr(buf, '\n');
        if (nl != NULL) *nl = '\0';
        if (parse_line(f, buf, line, err, errcap) != 0) return OTE_ERR_INVALID;
    }
    if (ferror(fp)) {
        snprintf(err, errcap, "line %d: read error: %s", line + 1, strerror(errno));
        return OTE_ERR_INVALID;
    }
    return OTE_OK;
}

ote_status_t ote_topo_file_read(const char *path, ote_topo_file_t **out, char *err, size_t errcap) {
    if (path == NULL || out == NULL || err == NULL || errcap == 0) return OTE_ERR_INVALID;
    err[0] = '\0';
    FILE *fp = fopen(path, "re");
    if (fp == NULL) {
        snprintf(err, errcap, "cannot open it: %s", strerror(errno));
        return OTE_ERR_NOT_FOUND;
    }
    ote_topo_file_t *f = ote_calloc(1, sizeof(*f));
    if (f == NULL) {
        fclose(fp);
        snprintf(err, errcap, "out of memory");
        return OTE_ERR_NOMEM;
    }
    ote_status_t st = read_lines(fp, f, err, errcap);
    fclose(fp);
    if (st != OTE_OK) {
        ote_free(f);
        return st;
    }
    *out = f;
    return OTE_OK;
}

void ote_topo_file_free(ote_topo_file_t *f) { ote_free(f); }

const ote_topo_entry_t *ote_topo_file_find(const ote_topo_file_t *f, ote_topo_kind_t kind,
                                           int index) {
    if (f == NULL) return NULL;
    for (size_t i = 0; i < f->n; i++)
        if (f->e[i].kind == kind && f->e[i].index == index) return &f->e[i];
    return NULL;
}
