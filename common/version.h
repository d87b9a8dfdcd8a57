/* version.h - kiln's version string, for logs, `kiln --version`, doctor and
 * the server metadata endpoint. */
#ifndef KILN_VERSION_H
#define KILN_VERSION_H

#define KILN_VERSION "0.1.0"

#endif
