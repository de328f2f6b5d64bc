# Per pinned GEMM width, the cases and the largest relL2 in a test_cuda_moe log (its
# "  wgmma W ... relL2 R" lines). Usage: awk -f lab/widths.awk LOG
/^  wgmma +[0-9]+ .*relL2/ {
    for (i = 1; i <= NF; i++) if ($i == "relL2") v = $(i + 1)
    w = $2; n[w]++
    if (v + 0 > m[w]) m[w] = v + 0
}
END { for (w in m) printf "  width %s: %d cases, max relL2 %.3g\n", w, n[w], m[w] }
