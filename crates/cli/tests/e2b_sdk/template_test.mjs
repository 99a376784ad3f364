// The official `e2b` JS SDK's `Template.build`, unchanged, against `omabox serve` (its base a
// Debian image): a template from `base` with a file copied in and a command run is built,
// then `Sandbox.create(NAME)` starts from it; a step omabox cannot honour is refused naming
// it. The last line printed is `OK`. Run from the npm prefix holding `e2b`.
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

try {
  await Template.build(Template().fromTemplate('base').runCmd('id', { user: 'user' }), 'omabox-js-bad')
  throw new Error('FAILED: a RUN as another user must be refused')
} catch (e) {
  check(String(e.message).includes('step 1 (RUN)'), `refused: ${e.message}`)
}
console.log('OK')
