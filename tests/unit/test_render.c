/* test_render.c - the attention-map renderer (cli/render.c).
 *
 * PNG: decodes (libpng) to the raster's size, and a one-hot attention
 * pattern lands in the right cells (bright where the weight is 1, dark
 * elsewhere), for every panel including the average.
 * SVG: well-formed (tag balance, quoted attributes, entities), exactly one
 * cell per weight with the right data-i/j/w, the labels present and escaped.
 * Letter legend: H heads, L queries, S keys.
 */
#include "test.h"
#include "render.h"
#include "seeds.h"

#include <unistd.h>

#ifdef MHA_HAVE_PNG
#include <png.h>
#endif

/* A one-hot pattern: head h, query i attends key (i + h) % S. */
static void one_hot(float *w /* (H,L,S) */, int64_t H, int64_t L, int64_t S) {
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < S; j++)
                w[(h * L + i) * S + j] = (j == (i + h) % S) ? 1.0f : 0.0f;
}

static char *tmp_path(char *buf, size_t n, const char *ext) {
    snprintf(buf, n, "/tmp/mha-test-render-%ld.%s", (long)getpid(), ext);
    return buf;
}

/* A small XML well-formedness check: balanced, properly nested tags with
 * matching names, quoted attribute values without raw '<' or '&', only the
 * five predefined or numeric entities in text, one root element. */
static int xml_well_formed(const char *s, char *why, size_t n) {
    const char *stack[64];
    size_t lens[64];
    int depth = 0, roots = 0;
    const char *p = s;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p)
            return snprintf(why, n, "unterminated XML declaration"), 0;
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            const char *e = strchr(p, ';');
            if (!e || e - p > 10)
                return snprintf(why, n, "bad entity at %.20s", p), 0;
            if (strncmp(p, "&amp;", 5) && strncmp(p, "&lt;", 4) && strncmp(p, "&gt;", 4) &&
                strncmp(p, "&quot;", 6) && strncmp(p, "&apos;", 6) && strncmp(p, "&#", 2))
                return snprintf(why, n, "unknown entity at %.20s", p), 0;
            p = e + 1;
            continue;
        }
        if (*p == '>')
            return snprintf(why, n, "stray '>' at %.20s", p), 0;
        if (*p != '<') {
            p++;
            continue;
        }
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t len = strcspn(name, " \t\n/>");
        if (len == 0)
            return snprintf(why, n, "empty tag name at %.20s", p), 0;
        const char *q = name + len;
        int self_closing = 0;
        for (;;) { /* attributes */
            while (*q == ' ' || *q == '\n' || *q == '\t')
                q++;
            if (*q == '>')
                break;
            if (q[0] == '/' && q[1] == '>') {
                self_closing = 1;
                q++;
                break;
            }
            if (closing || !*q)
                return snprintf(why, n, "bad tag at %.30s", p), 0;
            size_t an = strcspn(q, "= \t\n>");
            if (an == 0 || q[an] != '=' || q[an + 1] != '"')
                return snprintf(why, n, "unquoted attribute at %.30s", q), 0;
            const char *v = q + an + 2, *e = strchr(v, '"');
            if (!e)
                return snprintf(why, n, "unterminated attribute at %.30s", q), 0;
            for (const char *c = v; c < e; c++) {
                if (*c == '<')
                    return snprintf(why, n, "'<' in attribute at %.30s", q), 0;
                if (*c == '&' && strncmp(c, "&amp;", 5) && strncmp(c, "&lt;", 4) && strncmp(c, "&gt;", 4) &&
                    strncmp(c, "&quot;", 6) && strncmp(c, "&#", 2))
                    return snprintf(why, n, "raw '&' in attribute at %.30s", q), 0;
            }
            q = e + 1;
        }
        if (closing) {
            if (depth == 0 || lens[depth - 1] != len || strncmp(stack[depth - 1], name, len))
                return snprintf(why, n, "mismatched </%.*s>", (int)len, name), 0;
            depth--;
        } else if (!self_closing) {
            if (depth == 0)
                roots++;
            if (depth == 64)
                return snprintf(why, n, "too deep"), 0;
            stack[depth] = name;
            lens[depth++] = len;
        } else if (depth == 0) {
            roots++;
        }
        p = q + 1;
    }
    if (depth != 0)
        return snprintf(why, n, "%d unclosed element(s), innermost <%.*s>", depth, (int)lens[depth - 1],
                        stack[depth - 1]),
               0;
    if (roots != 1)
        return snprintf(why, n, "%d root elements", roots), 0;
    return 1;
}

TEST(render_xml_checker_catches_errors) {
    char why[128];
    CHECK(xml_well_formed("<a><b x=\"1\"/>t &amp; u</a>", why, sizeof why));
    CHECK(!xml_well_formed("<a><b></a></b>", why, sizeof why));
    CHECK(!xml_well_formed("<a>x & y</a>", why, sizeof why));
    CHECK(!xml_well_formed("<a x=\"<\"></a>", why, sizeof why));
    CHECK(!xml_well_formed("<a><b></a>", why, sizeof why));
    CHECK(!xml_well_formed("<a x=1></a>", why, sizeof why));
}

TEST(render_colormap_is_viridis_and_monotone_in_lightness) {
    uint8_t lo[3], hi[3], mid[3];
    render_colormap(0, lo);
    render_colormap(1, hi);
    render_colormap(0.5, mid);
    CHECK(lo[0] == 0x44 && lo[1] == 0x01 && lo[2] == 0x54);
    CHECK(hi[0] == 0xfd && hi[1] == 0xe7 && hi[2] == 0x25);
    CHECK(abs(mid[0] - 0x21) <= 4 && abs(mid[1] - 0x91) <= 4 && abs(mid[2] - 0x8c) <= 4);
    double prev = -1;
    for (int k = 0; k <= 100; k++) {
        uint8_t c[3];
        render_colormap(k / 100.0, c);
        double luma = 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
        CHECK(luma >= prev - 0.5);
        prev = luma;
    }
}

TEST(render_svg_one_cell_per_weight_with_labels) {
    enum { H = 3, L = 4, S = 5 };
    float w[H * L * S];
    one_hot(w, H, L, S);
    const char *q[L] = {"远", "a&b", "<x>", "say \"hi\""};
    const char *k[S] = {"方", "有", "颗", "苹", "bad\x01\xff"};
    render_maps m = {H, L, S, w, q, k, "title & <more>", 0};
    char path[128], err[256] = "";
    REQUIRE(render_svg_write(&m, tmp_path(path, sizeof path, "svg"), err, sizeof err) == RENDER_OK);
    size_t len;
    char *s = test_slurp(path, &len);
    remove(path);
    REQUIRE(s);
    char why[160] = "";
    if (!xml_well_formed(s, why, sizeof why))
        test_fail(__FILE__, __LINE__, "SVG not well-formed: %s", why);
    CHECK(render_panel_count(&m) == H + 1);
    CHECK(test_count(s, "<rect class=\"cell\"") == (H + 1) * L * S);
    CHECK(test_count(s, "data-w=") == (H + 1) * L * S);
    /* the one-hot weights and the average's 1/H where heads disagree */
    CHECK(strstr(s, "data-p=\"0\" data-i=\"1\" data-j=\"1\" data-w=\"1\""));
    CHECK(strstr(s, "data-p=\"0\" data-i=\"1\" data-j=\"2\" data-w=\"0\""));
    CHECK(strstr(s, "data-p=\"2\" data-i=\"3\" data-j=\"0\" data-w=\"1\""));
    CHECK(strstr(s, "data-p=\"3\" data-i=\"0\" data-j=\"0\" data-w=\"0.333333\""));
    CHECK(strstr(s, ">head 0<") && strstr(s, ">head 2<") && strstr(s, ">average<"));
    CHECK(strstr(s, ">远<") && strstr(s, ">苹<"));
    CHECK(strstr(s, ">a&amp;b<") && strstr(s, ">&lt;x&gt;<") && strstr(s, ">say &quot;hi&quot;<"));
    CHECK(strstr(s, "bad\xef\xbf\xbd\xef\xbf\xbd<")); /* control and invalid byte replaced */
    CHECK(strstr(s, "title &amp; &lt;more&gt;"));
    CHECK(!strstr(s, "a&b") && !strstr(s, "<x>"));
    free(s);
}

TEST(render_svg_single_head_has_no_average_and_index_labels) {
    float w[2 * 3] = {0.5f, 0.25f, 0.25f, 0, 1, 0};
    render_maps m = {1, 2, 3, w, NULL, NULL, NULL, 0};
    char path[128], err[256] = "";
    REQUIRE(render_svg_write(&m, tmp_path(path, sizeof path, "svg"), err, sizeof err) == RENDER_OK);
    size_t len;
    char *s = test_slurp(path, &len);
    remove(path);
    REQUIRE(s);
    char why[160] = "";
    CHECK(xml_well_formed(s, why, sizeof why));
    CHECK(test_count(s, "<rect class=\"cell\"") == 6);
    CHECK(!strstr(s, "average"));
    CHECK(strstr(s, "data-i=\"0\" data-j=\"1\" data-w=\"0.25\""));
    free(s);
}

TEST(render_rejects_bad_maps) {
    float w[4] = {0};
    char err[256] = "";
    render_maps m = {1, 0, 2, w, NULL, NULL, NULL, 0};
    CHECK(render_svg_write(&m, "/tmp/never-written.svg", err, sizeof err) == RENDER_ERR_ARG);
    CHECK(strstr(err, "shape"));
    render_maps big = {16, 4096, 4096, w, NULL, NULL, NULL, 0};
    CHECK(render_svg_write(&big, "/tmp/never-written.svg", err, sizeof err) == RENDER_ERR_ARG);
    CHECK(strstr(err, "cells"));
    render_maps ok = {1, 2, 2, w, NULL, NULL, NULL, 0};
    CHECK(render_svg_write(&ok, "/nonexistent-dir/x.svg", err, sizeof err) == RENDER_ERR_IO);
    CHECK(strstr(err, "/nonexistent-dir/x.svg"));
    render_box b;
    CHECK(render_cell_box(&ok, 1, 0, 0, &b) == RENDER_ERR_ARG); /* one head: one panel */
    CHECK(render_cell_box(&ok, 0, 2, 0, &b) == RENDER_ERR_ARG);
}

/* Centre pixel of cell (i,j) of panel p in an RGB8 image. */
static const uint8_t *cell_centre(const render_maps *m, const uint8_t *rgb, int width, int64_t p,
                                  int64_t i, int64_t j) {
    render_box b;
    if (render_cell_box(m, p, i, j, &b))
        return NULL;
    return rgb + ((size_t)(b.y + b.h / 2) * width + (b.x + b.w / 2)) * 3;
}

static int near(const uint8_t *px, const uint8_t want[3], int tol) {
    return abs(px[0] - want[0]) <= tol && abs(px[1] - want[1]) <= tol && abs(px[2] - want[2]) <= tol;
}

/* Every cell of every panel has the colour of its weight. */
static void check_cells(const render_maps *m, const uint8_t *rgb, int width) {
    for (int64_t p = 0; p < render_panel_count(m); p++)
        for (int64_t i = 0; i < m->L; i++)
            for (int64_t j = 0; j < m->S; j++) {
                double wsum = 0;
                for (int64_t h = 0; h < m->H; h++)
                    wsum += m->attn_weights[(h * m->L + i) * m->S + j];
                double want_w = p < m->H ? m->attn_weights[(p * m->L + i) * m->S + j] : wsum / m->H;
                uint8_t want[3];
                render_colormap(want_w, want);
                const uint8_t *px = cell_centre(m, rgb, width, p, i, j);
                if (!px || !near(px, want, 1)) {
                    test_fail(__FILE__, __LINE__, "panel %lld cell (%lld,%lld) w %.3f: pixel wrong",
                              (long long)p, (long long)i, (long long)j, want_w);
                    return;
                }
            }
}

TEST(render_raster_one_hot_lands_in_the_right_cells) {
    enum { H = 2, L = 5, S = 6 };
    float w[H * L * S];
    one_hot(w, H, L, S);
    render_maps m = {H, L, S, w, NULL, NULL, "one-hot", 0};
    render_image img;
    char err[256] = "";
    REQUIRE(render_raster(&m, &img, err, sizeof err) == RENDER_OK);
    check_cells(&m, img.rgb, img.width);
    uint8_t bright[3], dark[3];
    render_colormap(1, bright);
    render_colormap(0, dark);
    CHECK(near(cell_centre(&m, img.rgb, img.width, 0, 2, 2), bright, 0));
    CHECK(near(cell_centre(&m, img.rgb, img.width, 0, 2, 3), dark, 0));
    CHECK(near(cell_centre(&m, img.rgb, img.width, 1, 2, 3), bright, 0));
    CHECK(near(cell_centre(&m, img.rgb, img.width, 1, 4, 5), bright, 0));
    render_image_free(&img);
    CHECK(img.rgb == NULL);
}

#ifdef MHA_HAVE_PNG
TEST(render_png_decodes_to_the_raster_and_follows_the_weights) {
    enum { H = 3, L = 7, S = 4 };
    float w[H * L * S];
    one_hot(w, H, L, S);
    const char *q[L] = {"远", "方", "有", "颗", "苹", "果", "树"};
    const char *k[S] = {"a", "bb", "ccc", "dddd"};
    render_maps m = {H, L, S, w, q, k, "png test", 0};
    render_image img;
    char path[128], err[256] = "";
    REQUIRE(render_raster(&m, &img, err, sizeof err) == RENDER_OK);
    REQUIRE(render_png_write(&m, tmp_path(path, sizeof path, "png"), err, sizeof err) == RENDER_OK);

    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    int ok = png_image_begin_read_from_file(&pi, path);
    if (!ok) {
        test_fail(__FILE__, __LINE__, "libpng cannot read %s: %s", path, pi.message);
        remove(path);
        render_image_free(&img);
        return;
    }
    CHECK((int)pi.width == img.width && (int)pi.height == img.height);
    pi.format = PNG_FORMAT_RGB;
    uint8_t *px = malloc(PNG_IMAGE_SIZE(pi));
    REQUIRE(px);
    CHECK(png_image_finish_read(&pi, NULL, px, 0, NULL));
    remove(path);
    CHECK(memcmp(px, img.rgb, (size_t)img.width * img.height * 3) == 0);
    check_cells(&m, px, img.width);
    uint8_t bright[3];
    render_colormap(1, bright);
    CHECK(near(cell_centre(&m, px, img.width, 2, 1, 3), bright, 0)); /* (1+2)%4 = 3 */
    free(px);
    render_image_free(&img);
}

/* PNG write failures (injected ENOSPC at every step, a FIFO target, a
 * missing directory) are tests/unit/test_safe_write.c; no test writes to a
 * device. */
#else
TEST(render_png_without_libpng_is_unsupported) {
    float w[4] = {1, 0, 0, 1};
    render_maps m = {1, 2, 2, w, NULL, NULL, NULL, 0};
    char err[256] = "";
    CHECK(!render_png_available());
    CHECK(render_png_write(&m, "/tmp/never.png", err, sizeof err) == RENDER_ERR_UNSUPPORTED);
    CHECK(strstr(err, "libpng"));
    SKIP_PART("PNG encoding and write-failure checks: built without libpng");
}
#endif

TEST(render_seed_example_maps) {
    seed_example ex;
    REQUIRE(seed_example_make(&ex, 7, 8, 2, 42) == 0);
    float w[2 * 7 * 7];
    mha_status st = seed_example_forward(&ex, NULL, w);
    seed_example_free(&ex);
    REQUIRE_OK(st);
    render_maps m = {2, 7, 7, w, NULL, NULL, NULL, 0};
    render_image img;
    char err[256] = "";
    REQUIRE(render_raster(&m, &img, err, sizeof err) == RENDER_OK);
    /* the scale tops out at the largest weight: that cell is the brightest */
    float mx = 0;
    for (int k = 0; k < 2 * 7 * 7; k++)
        mx = w[k] > mx ? w[k] : mx;
    m.vmax = mx; /* same as auto: check_cells normalises by 1, so compare by hand */
    for (int64_t p = 0; p < 2; p++)
        for (int64_t i = 0; i < 7; i++)
            for (int64_t j = 0; j < 7; j++) {
                uint8_t want[3];
                render_colormap(w[(p * 7 + i) * 7 + j] / mx, want);
                CHECK(near(cell_centre(&m, img.rgb, img.width, p, i, j), want, 1));
            }
    render_image_free(&img);
}
