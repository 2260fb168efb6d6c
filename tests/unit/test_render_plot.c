/* test_render_plot.c - the line plots of cli/render.c (mha train's loss curve).
 *
 * SVG: the title, axis labels and legend names present (escaped), one
 * polyline per series holding exactly its finite points, five tick labels
 * per axis.  Raster: 720x400, each series' colour drawn, the background
 * white.  PNG: the signature (or RENDER_ERR_UNSUPPORTED without libpng).
 * Bad plots: RENDER_ERR_ARG with a message.  Files go to a mkdtemp folder.
 */
#include "test.h"
#include "render.h"

#include <unistd.h>

/* A fresh mkdtemp folder in dir and path = dir/name; false when none. */
static bool temp_file(char *dir, char *path, size_t n, const char *name) {
    if (!mkdtemp(dir))
        return false;
    snprintf(path, n, "%s/%s", dir, name);
    return true;
}

static void temp_done(const char *dir, const char *path) {
    unlink(path);
    rmdir(dir);
}

/* The points of the polyline whose data-name is name: its "x,y" pairs. */
static int polyline_points(const char *svg, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "data-name=\"%s\"", name);
    const char *p = strstr(svg, key);
    if (!p || !(p = strstr(p, "points=\"")))
        return -1;
    p += 8;
    const char *end = strchr(p, '"');
    int n = 0;
    for (; p < end; p++)
        n += *p == ',';
    return n;
}

#define N 9
static const int64_t steps[N] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
static const float raw[N] = {2.5f, 2.1f, NAN, 1.9f, 1.7f, 1.8f, 1.2f, 1.1f, 0.9f};
static const float mean[N] = {2.5f, 2.4f, 2.3f, 2.2f, 2.0f, 1.9f, 1.7f, 1.5f, 1.3f};

static render_plot sample(render_series *s) {
    s[0] = (render_series){"per <step>", raw, {158, 195, 240}, 1};
    s[1] = (render_series){"running mean", mean, {31, 78, 156}, 2};
    return (render_plot){N, steps, 2, s, "loss & curve", "step", "cross-entropy loss"};
}

TEST(render_plot_svg_has_the_series_ticks_and_labels) {
    char dir[] = "/tmp/mha-test-plot-XXXXXX", path[64], err[256] = "";
    REQUIRE(temp_file(dir, path, sizeof path, "loss.svg"));
    render_series s[2];
    render_plot p = sample(s);
    CHECK(render_plot_svg_write(&p, path, err, sizeof err) == RENDER_OK);
    char *svg = test_slurp(path, NULL);
    REQUIRE(svg != NULL);
    CHECK(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
    CHECK(strstr(svg, ">loss &amp; curve</text>") != NULL);
    CHECK(strstr(svg, ">step</text>") != NULL);
    CHECK(strstr(svg, ">cross-entropy loss</text>") != NULL);
    CHECK(strstr(svg, ">per &lt;step&gt;</text>") != NULL);
    CHECK(strstr(svg, ">running mean</text>") != NULL);
    CHECK(test_count(svg, "<polyline") == 2);
    CHECK(polyline_points(svg, "per &lt;step&gt;") == N - 1); /* the NaN is skipped */
    CHECK(polyline_points(svg, "running mean") == N);
    CHECK(test_count(svg, "stroke=\"#ddd\"") == 5); /* grid lines */
    CHECK(strstr(svg, ">2.5</text>") != NULL);  /* the top tick: the largest value */
    CHECK(strstr(svg, ">1</text>") != NULL && strstr(svg, ">9</text>") != NULL); /* x ends */
    CHECK(strstr(svg, "</svg>\n") != NULL);
    free(svg);
    temp_done(dir, path);
}

TEST(render_plot_raster_draws_every_series) {
    render_series s[2];
    render_plot p = sample(s);
    render_image img;
    char err[256] = "";
    CHECK(render_plot_raster(&p, &img, err, sizeof err) == RENDER_OK);
    REQUIRE(img.rgb != NULL);
    CHECK(img.width == 720 && img.height == 400);
    int64_t hits[2] = {0, 0}, white = 0;
    for (int64_t k = 0; k < (int64_t)img.width * img.height; k++) {
        const uint8_t *c = img.rgb + 3 * k;
        for (int q = 0; q < 2; q++)
            hits[q] += memcmp(c, s[q].rgb, 3) == 0;
        white += c[0] == 255 && c[1] == 255 && c[2] == 255;
    }
    CHECK(hits[0] > 100 && hits[1] > 200); /* lines across the 630-pixel-wide area */
    CHECK(white > (int64_t)img.width * img.height / 2);
    render_image_free(&img);
}

TEST(render_plot_png_is_a_png) {
    char dir[] = "/tmp/mha-test-plot-XXXXXX", path[64], err[256] = "";
    REQUIRE(temp_file(dir, path, sizeof path, "loss.png"));
    render_series s[2];
    render_plot p = sample(s);
    render_status st = render_plot_png_write(&p, path, err, sizeof err);
    if (!render_png_available()) {
        CHECK(st == RENDER_ERR_UNSUPPORTED && strstr(err, "libpng") != NULL);
        rmdir(dir);
        SKIP("built without libpng");
    }
    CHECK(st == RENDER_OK);
    FILE *f = fopen(path, "rb");
    unsigned char sig[8] = {0};
    CHECK(f && fread(sig, 1, 8, f) == 8 && memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0);
    if (f)
        fclose(f);
    temp_done(dir, path);
}

TEST(render_plot_refuses_bad_plots) {
    render_series s[2];
    render_plot p = sample(s);
    render_image img;
    char err[256] = "";
    p.nseries = 0;
    CHECK(render_plot_raster(&p, &img, err, sizeof err) == RENDER_ERR_ARG && err[0]);
    p = sample(s);
    s[1].width = 5;
    CHECK(render_plot_raster(&p, &img, err, sizeof err) == RENDER_ERR_ARG);
    p = sample(s);
    s[0].y = NULL;
    CHECK(render_plot_raster(&p, &img, err, sizeof err) == RENDER_ERR_ARG);
    CHECK(render_plot_raster(NULL, &img, err, sizeof err) == RENDER_ERR_ARG);
    p = sample(s);
    p.n = 0; /* no points: an empty frame, not an error */
    CHECK(render_plot_raster(&p, &img, err, sizeof err) == RENDER_OK);
    render_image_free(&img);
}
