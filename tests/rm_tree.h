/* rm_tree(dir): removes a test's scratch directory with everything in it (depth first, links
 * removed, never followed), for the tests that write checkpoints under mkdtemp directories.
 *
 * Header-only (static functions) like moe_fixture.h. It returns nftw's result and reports
 * nothing itself: a teardown can do no more about a half-removed /tmp directory. */
#ifndef K3_TEST_RM_TREE_H
#define K3_TEST_RM_TREE_H

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

static int rm_tree_one(const char *p, const struct stat *s, int flag, struct FTW *f) {
    (void)s, (void)flag, (void)f;
    return remove(p);
}

static int rm_tree(const char *dir) {
    return nftw(dir, rm_tree_one, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
