/* Uses OrbitTE's verbs shim alone: opens the software provider, lists its devices,
 * registers a buffer in a PD and tears everything down through the ops table. Exits 0
 * only if every step worked. */
#include <stdio.h>
#include <stdlib.h>

#include "verbs/verbs.h"

int main(void) {
    ote_verbs_t *v = NULL;
    ote_status_t st = ote_verbs_open("sim", NULL, &v);
    if (st != OTE_OK) {
        fprintf(stderr, "open sim: %s\n", ote_status_str(st));
        return 1;
    }
    struct ibv_device **list = NULL;
    int n = 0;
    int err = v->ops->get_device_list(v, &list, &n);
    if (err != 0 || n < 1) {
        fprintf(stderr, "get_device_list: err %d, %d devices\n", err, n);
        ote_verbs_close(v);
        return 1;
    }
    struct ibv_context *ctx = NULL;
    err = v->ops->open_device(v, list[0], &ctx);
    int rc = 1;
    if (err == 0) {
        struct ibv_pd *pd = NULL;
        static char buf[4096];
        struct ibv_mr *mr = NULL;
        if (v->ops->alloc_pd(v, ctx, &pd) == 0) {
            if (v->ops->reg_mr(v, pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE, &mr) == 0) {
                printf("verbs_user: %d device(s), first '%s', lkey 0x%x\n", n,
                       v->ops->get_device_name(v, list[0]), mr->lkey);
                rc = v->ops->dereg_mr(v, mr) == 0 ? 0 : 1;
            }
            if (v->ops->dealloc_pd(v, pd) != 0) rc = 1;
        }
        if (v->ops->close_device(v, ctx) != 0) rc = 1;
    }
    v->ops->free_device_list(v, list);
    ote_verbs_close(v);
    return rc;
}
