// Load an .spz with Niantic's own library (its WebAssembly build, @adobe/spz, which
// splat-transform ships) under each target frame; print the count and the positions.
// node spz_probe.mjs SPZ_JS FILE
import { readFileSync } from 'node:fs';

const spz = await (await import(process.argv[2])).default();
const data = readFileSync(process.argv[3]);
const out = {};
for (const name of ['UNSPECIFIED', 'RDF', 'RUB']) {
    const cloud = await spz.loadSpzFromBuffer(data, { to: spz.CoordinateSystem[name] });
    out[name] = { numPoints: cloud.numPoints, shDegree: cloud.shDegree,
                  antialiased: cloud.antialiased, positions: Array.from(cloud.positions) };
}
console.log(JSON.stringify(out));
