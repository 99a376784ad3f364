// The official `e2b` JS SDK's `Template.build`, unchanged, against `omabox serve` (its base a
// Debian image): a template from `base` with a file copied in and a command run is built,
// then `Sandbox.create(NAME)` starts from it; a build tagged `v2` and a tag given to it
// start their build, tags are listed and taken off; a step omabox cannot honour is refused
// naming it. The last line printed is `OK`. Run from the npm prefix holding `e2b`.
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox, Template } from 'e2b'

function check(condition, what) {
  if (!condition) throw new Error(`FAILED: ${what}`)
  console.log(`ok: ${what}`)
}

const ctx = mkdtempSync(join(tmpdir(), 'tpl-'))
writeFileSync(join(ctx, 'greeting.txt'), 'hello from js\n')
const template = Template({ fileContextPath: ctx })
  .fromTemplate('base')
  .copy('greeting.txt', '/opt/js/')
  .runCmd('echo js-built >> /opt/js/greeting.txt')
const info = await Template.build(template, 'omabox-js-tpl')
check(info.templateId && info.buildId, `built: ${JSON.stringify(info)}`)
const sbx = await Sandbox.create('omabox-js-tpl', { timeoutMs: 60_000 })
const r = await sbx.commands.run('cat /opt/js/greeting.txt')
check(r.stdout === 'hello from js\njs-built\n', `a sandbox of the template: ${JSON.stringify(r.stdout)}`)
await sbx.kill()

// Tags: NAME:TAG builds get their tag, NAME stays on `default`; tags are given and taken.
const v2 = await Template.build(
  Template().fromTemplate('omabox-js-tpl').runCmd('echo v2 >> /opt/js/greeting.txt'),
  'omabox-js-tpl:v2',
)
const tagged = await Template.assignTags('omabox-js-tpl:v2', ['prod'])
check(tagged.buildId === v2.buildId && tagged.tags.join() === 'prod', `assignTags: ${JSON.stringify(tagged)}`)
const tags = Object.fromEntries((await Template.getTags('omabox-js-tpl')).map((t) => [t.tag, t.buildId]))
check(
  tags.default === info.buildId && tags.v2 === v2.buildId && tags.prod === v2.buildId,
  `getTags: ${JSON.stringify(tags)}`,
)
const prod = await Sandbox.create('omabox-js-tpl:prod', { timeoutMs: 30_000 })
const last = await prod.commands.run('tail -n 1 /opt/js/greeting.txt')
await prod.kill()
check(last.stdout === 'v2\n', `a sandbox of a tag: ${JSON.stringify(last.stdout)}`)
await Template.removeTags('omabox-js-tpl', 'prod')
const left = (await Template.getTags('omabox-js-tpl')).map((t) => t.tag).sort()
check(left.join() === 'default,v2', `removeTags: ${left}`)

try {
  await Template.build(Template().fromTemplate('base').runCmd('id', { user: 'user' }), 'omabox-js-bad')
  throw new Error('FAILED: a RUN as another user must be refused')
} catch (e) {
  check(String(e.message).includes('step 1 (RUN)'), `refused: ${e.message}`)
}
console.log('OK')
