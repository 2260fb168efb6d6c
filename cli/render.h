/* render.h - attention maps (and line plots) as pictures: SVG (by hand) and
 * PNG (libpng).
 *
 * Given per-head attention weights (H,L,S) - H heads, L queries, S keys -
 * the renderer draws a grid of heat maps, one panel per head plus one for
 * the head average (when H > 1), with a shared viridis colour scale (legend
 * bar with tick values), panel titles ("head 0", ..., "average") and the
 * tokens on both axes: queries down the rows, keys along the columns.
 *
 * SVG: one <rect class="cell"> per weight carrying data-p (panel), data-i
 * (query), data-j (key) and data-w (weight), with a <title> tooltip; labels
 * are <text> (any UTF-8, escaped).  PNG: the same geometry rasterised into
 * RGB8 with a built-in 5x7 bitmap font for printable ASCII; a token with
 * other characters (CJK) is labelled by its index in the PNG.
 *
 * This is CLI code (it may do I/O), not library code: functions return a
 * render_status and fill a caller's message buffer, they never print.
 */
#ifndef MHA_CLI_RENDER_H
#define MHA_CLI_RENDER_H

#include <stddef.h>
#include <stdint.h>

typedef enum render_status {
    RENDER_OK = 0,
    RENDER_ERR_ARG = 1,         /* bad maps: NULL, sizes, too many cells     */
    RENDER_ERR_NOMEM = 2,
    RENDER_ERR_IO = 3,          /* open/write/close failed, or libpng failed */
    RENDER_ERR_UNSUPPORTED = 4  /* PNG asked for in a build without libpng   */
} render_status;

typedef struct render_maps {
    int64_t H, L, S;                  /* heads, queries, keys (each >= 1)       */
    const float *attn_weights;        /* (H,L,S) row-major; NaN drawn grey      */
    const char *const *query_labels;  /* L UTF-8 labels, or NULL: "0".."L-1"    */
    const char *const *key_labels;    /* S UTF-8 labels, or NULL: "0".."S-1"    */
    const char *title;                /* figure title, or NULL                  */
    float vmax;                       /* top of the colour scale; <= 0 or NaN:
                                         the largest finite weight (or 1)       */
} render_maps;

/* Caps that keep a request from asking for gigabytes. */
#define RENDER_MAX_CELLS ((int64_t)1 << 21) /* panels * L * S                   */
#define RENDER_MAX_PIXELS ((int64_t)1 << 26) /* PNG width * height              */

/* An RGB8 image, row-major, 3 bytes per pixel; free with render_image_free. */
typedef struct render_image {
    int width, height;
    uint8_t *rgb; /* (height, width, 3) */
} render_image;

/* A rectangle in image pixels: [x, x+w) x [y, y+h). */
typedef struct render_box {
    int x, y, w, h;
} render_box;

/* Number of panels: H, plus 1 for the average when H > 1. */
int64_t render_panel_count(const render_maps *m);

/* Writes the figure as SVG to path (through mha_safe_file: a failure
 * leaves the old file, or a device/FIFO target, in place).  err (may be
 * NULL) gets a message. */
render_status render_svg_write(const render_maps *m, const char *path, char *err, size_t errlen);

/* Writes the figure as PNG to path (RENDER_ERR_UNSUPPORTED without libpng).
 * Written like the SVG: on failure only mha's temporary is removed. */
render_status render_png_write(const render_maps *m, const char *path, char *err, size_t errlen);

/* 1 when this build can write PNG. */
int render_png_available(void);

/* Rasterises the figure (what render_png_write encodes). */
render_status render_raster(const render_maps *m, render_image *img, char *err, size_t errlen);
void render_image_free(render_image *img);

/* The pixel box of cell (i,j) of panel p (p == H is the average) in the
 * raster of m.  Returns RENDER_ERR_ARG when an index is out of range. */
render_status render_cell_box(const render_maps *m, int64_t p, int64_t i, int64_t j,
                              render_box *box);

/* The colour of t in [0,1] (clamped) on the viridis colour map. */
void render_colormap(double t, uint8_t rgb[3]);

/* ---- line plots (the loss curve of `mha train`) ------------------------------
 * n points per series over shared x values, in a 720x400 frame: the title
 * on top, a 4x4 grid with tick values (%.3g on y, %.0f on x), the axis
 * labels, one line per series (non-finite points are skipped; the line
 * joins the finite ones) and a legend with the series' names.  The y range
 * covers every finite value (starting at 0 or above when all are >= 0).
 * SVG: one <polyline class="series" data-name=...> per series, the texts
 * escaped.  PNG: the same drawing, the texts in the 5x7 font. */
#define RENDER_MAX_SERIES 8
#define RENDER_MAX_POINTS ((int64_t)1 << 24)

typedef struct render_series {
    const char *name;   /* legend text                                      */
    const float *y;     /* n values                                         */
    uint8_t rgb[3];     /* line colour                                      */
    int width;          /* line width in pixels, 1..4                       */
} render_series;

typedef struct render_plot {
    int64_t n;                      /* points per series (0 allowed)        */
    const int64_t *x;               /* n x values, increasing               */
    int nseries;                    /* 1..RENDER_MAX_SERIES                 */
    const render_series *series;
    const char *title, *xlabel, *ylabel; /* each may be NULL               */
} render_plot;

/* Writes the plot as SVG / PNG to path, like render_svg_write and
 * render_png_write (RENDER_ERR_UNSUPPORTED for PNG without libpng). */
render_status render_plot_svg_write(const render_plot *p, const char *path, char *err,
                                    size_t errlen);
render_status render_plot_png_write(const render_plot *p, const char *path, char *err,
                                    size_t errlen);
/* Rasterises the plot (what render_plot_png_write encodes). */
render_status render_plot_raster(const render_plot *p, render_image *img, char *err,
                                 size_t errlen);

#endif
