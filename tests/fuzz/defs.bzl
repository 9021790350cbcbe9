"""Expose the headers of cc_library deps as runfiles, so a script can compile sources
against them with another compiler (clang for libFuzzer) while visibility stays as the
owning packages declare it."""

def _cc_headers_impl(ctx):
    hdrs = depset(transitive = [d[CcInfo].compilation_context.headers for d in ctx.attr.deps])
    return [DefaultInfo(files = hdrs, runfiles = ctx.runfiles(transitive_files = hdrs))]

cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
