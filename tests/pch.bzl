"""gtest_pch: <gtest/gtest.h> precompiled once per configuration for the test sources.

Parsing GoogleTest's headers took about a second of each test source's compile, in each
of the three configurations a CI run builds. gcc reads a precompiled header in place of a
header when it finds NAME.gch beside NAME in an include directory and the header is the
first one the source includes (94 of the 128 test sources begin with <gtest/gtest.h>; the
others compile as before). The header is compiled here with the C++ compile command line
of the configuration the tests are built in (its --copt and --cxxopt, PIC, and the -O1
that .bazelrc gives tests/*.cc), so it matches their flags. .bazelrc adds -Winvalid-pch
for the test sources: a precompiled header found but not usable (flags drifted apart) is
a warning, and -Werror makes it a build failure, never a silent slowdown.
"""

load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _gtest_pch_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    gtest = ctx.attr.gtest[CcInfo].compilation_context
    src = [h for h in gtest.headers.to_list() if h.path.endswith("include/gtest/gtest.h")]
    if len(src) != 1:
        fail("gtest_pch: no single include/gtest/gtest.h among the headers of " + str(ctx.attr.gtest.label))

    # <name>/gtest/gtest.h (a link to GoogleTest's) and gtest.h.gch beside it: <name> is
    # the include directory, so that #include <gtest/gtest.h> finds the pair there first.
    hdr = ctx.actions.declare_file(ctx.label.name + "/gtest/gtest.h")
    gch = ctx.actions.declare_file(ctx.label.name + "/gtest/gtest.h.gch")
    ctx.actions.symlink(output = hdr, target_file = src[0])

    cpp = ctx.fragments.cpp
    variables = cc_common.create_compile_variables(
        cc_toolchain = cc_toolchain,
        feature_configuration = features,
        source_file = hdr.path,
        output_file = gch.path,
        user_compile_flags = cpp.copts + cpp.cxxopts + ["-O1"],
        system_include_directories = depset(transitive = [gtest.system_includes, gtest.includes]),
        use_pic = True,
    )
    action = ACTION_NAMES.cpp_compile
    args = cc_common.get_memory_inefficient_command_line(
        feature_configuration = features,
        action_name = action,
        variables = variables,
    )
    ctx.actions.run(
        executable = cc_common.get_tool_for_action(feature_configuration = features, action_name = action),
        arguments = ["-x", "c++-header"] + args,
        env = cc_common.get_environment_variables(
            feature_configuration = features,
            action_name = action,
            variables = variables,
        ),
        inputs = depset([hdr], transitive = [gtest.headers, cc_toolchain.all_files]),
        outputs = [gch],
        mnemonic = "CppPch",
        progress_message = "Precompiling <gtest/gtest.h> for the test sources",
    )
    include_dir = hdr.dirname[:-len("/gtest")]
    return [
        DefaultInfo(files = depset([hdr, gch])),
        CcInfo(compilation_context = cc_common.create_compilation_context(
            headers = depset([hdr, gch]),
            includes = depset([include_dir]),
        )),
    ]

gtest_pch = rule(
    implementation = _gtest_pch_impl,
    attrs = {
        "gtest": attr.label(mandatory = True, providers = [CcInfo]),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    fragments = ["cpp"],
)
