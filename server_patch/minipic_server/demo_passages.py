"""Passages and questions for ``make demo``: a fictional town, written for MiniPIC.

Everything here is invented (no real place, person or source), so a model can only answer
from the passages. Part of MiniPIC, under the same Apache-2.0 licence.
"""

from __future__ import annotations

PASSAGES = [
    # 0
    "Aldmere is a market town on the River Sell, about forty kilometres from the coast. It received its "
    "charter in 1214, when a weekly wool market was granted to the abbey that owned the land on the east "
    "bank. The old town grew around that market square, and several of its timber-framed houses still "
    "stand along Fleece Street and Tanners Row. Today Aldmere has a population of about 48,000 and is the "
    "administrative centre of the Sell Valley district. Its economy moved from wool to light engineering "
    "in the twentieth century, and more recently to education and tourism, helped by the university and "
    "by the walking trails of the nearby hills. The town council meets in the Guildhall, a stone building "
    "of 1608 that also holds the district archive. Aldmere has been twinned with the Breton port of "
    "Kerlouan since 1964, and an exchange of school pupils between the two towns takes place every "
    "spring. The town's coat of arms shows a heron standing on three wavy lines, a reference to the birds "
    "that still nest in the reed beds below the weir.",
    # 1
    "The Sell Bridge is the oldest surviving crossing of the river in Aldmere. It was designed by the "
    "engineer Thomas Garrow and opened in 1786, replacing a wooden bridge that had been swept away by ice "
    "during the hard winter of 1779. Garrow built it in local sandstone with seven semicircular arches, "
    "the central arch being the widest at nineteen metres so that barges could pass under it at high "
    "water. The bridge carried the main road to the coast until 1971, when a concrete bypass bridge was "
    "opened two kilometres downstream. Since then it has been closed to heavy vehicles. A plaque on the "
    "upstream parapet records the names of the masons who worked on it, and the toll house at the western "
    "end, where a fee of one penny per cart was collected until 1842, is now a small cafe. The bridge was "
    "given listed status in 1951 and was repaired after the flood of 1893 and again in 2009, when two of "
    "the arches were strengthened with steel ties hidden inside the stonework.",
    # 2
    "St Aldhelm's Cathedral stands on a low rise at the centre of the old town. Building began in 1310 "
    "on the site of the abbey church and the nave was finished in 1402. The spire, added in the middle "
    "of the fifteenth century, is 96 metres tall and can be seen from most of the Sell Valley on a clear "
    "day. The cathedral is known for its east window of stained glass, which shows the story of the "
    "flood and was paid for by the wool merchants in 1468. Its ring of ten bells is rung every Sunday "
    "morning and on the evening of the Lantern Festival. During the civil war the building was used as a "
    "stable and lost most of its medieval statues; the carvings on the west front today are copies made "
    "in the 1870s. The cathedral library holds about 6,000 books, including a chained Bible and a "
    "herbal printed in Antwerp. Visitors can climb 212 steps to a gallery at the base of the spire from "
    "April to October.",
    # 3
    "The Aldmere Gazette is the town's daily newspaper. It was founded in 1821 by Eliza Fenwick, a "
    "printer's widow who had taken over her husband's shop on Fleece Street, and it is one of the oldest "
    "newspapers in the region still published under its original name. At first it appeared once a week "
    "and carried market prices, shipping news from the coast and notices from the Guildhall. It became a "
    "daily in 1889, after the railway made it possible to receive national news by telegraph and "
    "distribute copies across the valley by the first morning train. The Gazette campaigned for the "
    "building of the flood wall after 1893 and for the founding of the university. Its offices moved to a "
    "former grain store by the river in 1962. The paper's archive, covering two centuries of local life, "
    "was digitised between 2015 and 2018 and can be searched free of charge at the district library. The "
    "current editor is the sixteenth in its history.",
    # 4
    "The University of Aldmere was founded in 1891 as the Sell Valley College of Science and received "
    "university status in 1957. It has about 14,000 students in four faculties. Its best known department "
    "is marine biology, which runs a field station at the mouth of the Sell and operates the research boat "
    "Curlew. The main campus lies on the northern edge of the town, around a quadrangle built in red "
    "brick between 1894 and 1910. The university library, opened in 1968, was designed by the architect "
    "Hanna Lindqvist and is known for its reading room under a shallow copper dome. The university's "
    "motto is 'Learning flows like the river'. Every June its graduation ceremonies are held in the "
    "cathedral, and the procession of graduates across the Sell Bridge is a local tradition. The "
    "university is the largest employer in the town, and about a third of its students come from "
    "abroad, many of them on exchange programmes with universities in Norway and the Netherlands.",
    # 5
    "Copperfield Mill was the largest of the wool mills that lined the Sell below Aldmere. It was built "
    "in 1840 by the brothers Josiah and Samuel Copperfield and used water power from a weir on the river "
    "until a steam engine was installed in 1866. At its peak, in the 1890s, it employed about 900 "
    "people, many of them children, and produced blankets and heavy cloth for army uniforms. The mill "
    "closed in 1968 after years of competition from cheaper imports. Its five-storey main building "
    "stood empty for three decades before being restored in 2004. It now houses the Sell Valley Textile "
    "Museum, a public library and forty flats. The museum keeps three working looms and a collection of "
    "pattern books, and on the first Saturday of each month volunteers demonstrate spinning and weaving. "
    "The mill's chimney, 52 metres tall, is a landmark for walkers coming down from the hills.",
    # 6
    "The Great Flood of 1893 was the worst natural disaster in the history of Aldmere. After two weeks of "
    "heavy rain in October, the River Sell rose more than six metres above its normal level on the night "
    "of 14 October and flooded the lower town. Seventeen people died, most of them in the cottages along "
    "the riverside, and around 1,200 were left homeless. Copperfield Mill was closed for four months and "
    "two arches of the Sell Bridge were damaged. The disaster led to the construction of a stone flood "
    "wall along both banks, completed in 1899, and of a reservoir in the hills to control the flow of the "
    "Vell, the river's main tributary. A marker on the wall of the Guildhall shows the height the water "
    "reached. The flood is also remembered in the cathedral's east window and in a ballad, The Black "
    "October, which is still sung at the Lantern Festival.",
    # 7
    "Aldmere Football Club, nicknamed the Herons after the bird on the town's coat of arms, was founded in "
    "1879 by workers from the wool mills. The club plays in blue and white and has its home at the Marsh "
    "Lane ground, which holds about 7,500 spectators and was opened in 1921 on land given by the "
    "Copperfield family. The Herons' greatest success came in 1958, when they reached the final of the "
    "national amateur cup and lost 2-1 after extra time. The club's record goalscorer is Walter Dunning, "
    "who scored 214 goals between 1926 and 1939. The club also runs a women's team, founded in 1994, and "
    "a youth academy with teams from under-nine to under-eighteen. Its oldest rivals are Sellmouth "
    "Town, and the derby between the two clubs is played every Boxing Day.",
    # 8
    "Aldmere is known in the region for a few local foods. The best known is Sell Blue, a soft blue "
    "cheese made from cow's milk on farms in the upper valley since at least the seventeenth century. It "
    "ripens for about ten weeks in cool cellars and received protected status in 2011. Aldmere eel pie, "
    "once a cheap food of the riverside workers, is now rare because eels have become scarce in the Sell; "
    "it is still served at the Lantern Festival. The town's bakers are known for the heron bun, a sweet "
    "bread roll with currants and a glaze of honey, traditionally eaten on the feast of St Aldhelm in May. "
    "A farmers' market is held in the market square every Thursday and Saturday, continuing the weekly "
    "market of the town's medieval charter. Several breweries have operated in the town, and the last "
    "of them, the Guildhall Brewery, still makes a dark ale called Black October.",
    # 9
    "The railway reached Aldmere in 1847, when the Sell Valley Railway opened a line from the coast. "
    "Aldmere Central station, built in yellow brick with an iron and glass roof over its two platforms, "
    "was designed by the railway's engineer, Frederick Hale. The line brought coal to the mills and "
    "carried their cloth to the port of Sellmouth, and it made the town a market for the whole valley. "
    "A branch line to the quarries at Harrow Hills opened in 1872 and closed in 1953. Passenger numbers "
    "fell in the 1960s, and the line beyond Aldmere to the upper valley closed in 1966. The remaining "
    "line to the coast was electrified in 1994 and today has a train every thirty minutes, with a journey "
    "time of twenty-six minutes to Sellmouth. The former goods yard next to the station was turned into "
    "a bus station and a car park in 2001.",
    # 10
    "The Harrow Hills rise to the north and west of Aldmere and form the watershed between the Sell and "
    "the neighbouring Tarn valley. The hills are made of sandstone and shale and were quarried for "
    "building stone until the 1950s; several of the old quarries are now nature reserves. The highest "
    "point is Beacon Tor, at 412 metres, where a fire beacon was kept ready during the wars against "
    "France and where a stone pillar now marks the summit. The Harrow Way, a waymarked footpath of 64 "
    "kilometres, follows the ridge of the hills and starts at the Sell Bridge. The hills are known for "
    "their heather moorland, which turns purple in late August, and for a small population of red "
    "grouse. The reservoir built after the flood of 1893 lies in a side valley below Beacon Tor and now "
    "supplies most of the town's drinking water.",
    # 11
    "The Lantern Festival is held in Aldmere on the second Saturday of November. It was started in 1952 "
    "by the town's schools to mark the end of food rationing after the war, and it has grown into the "
    "largest event of the year, attracting about 20,000 visitors. Children make lanterns from willow and "
    "paper in the weeks before the festival, and at dusk a procession of several thousand lanterns "
    "winds from the market square, across the Sell Bridge and back along the river wall. The evening ends "
    "with the cathedral bells and a fireworks display over the river. Stalls in the square sell eel pie, "
    "heron buns and hot cider. Since 1988 a prize has been given for the best lantern made by a school "
    "class, and the winning lantern is hung in the Guildhall until the following spring.",
]

# (passage indices in prompt order, question, expected answer): the answer's passage is among
# the indices, at a different place each time, with other passages before and after it.
QUESTIONS = [
    ([0, 4, 1, 7, 11, 9], "Who designed the Sell Bridge?", "Thomas Garrow"),
    ([9, 2, 5, 3, 10, 0], "How tall is the spire of St Aldhelm's Cathedral?", "96 metres"),
    ([6, 3, 8, 0, 2, 11], "Who founded the Aldmere Gazette?", "Eliza Fenwick"),
    ([11, 5, 10, 6, 7, 1], "What is the nickname of Aldmere Football Club?", "Herons"),
    ([1, 8, 4, 9, 6, 11], "In which year was the Lantern Festival started?", "1952"),
    ([10, 7, 3, 2, 5, 8], "What is the highest point of the Harrow Hills?", "Beacon Tor"),
]
